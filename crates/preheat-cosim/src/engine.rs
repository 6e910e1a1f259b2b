//! The event engine under the simulator: vCPUs computing phases and waiting at barriers on
//! CPUs, advanced from event to event. Who runs where is decided outside: by the slice planner
//! for the coscheduling policies ([`Engine::apply`]), or by the built-in CFS model
//! ([`Engine::start_cfs`]).
//!
//! # Model
//!
//! * Each vCPU of an instance computes a phase (drawn per thread per phase), then — in a
//!   barrier-synchronised instance — waits at the instance's barrier. When the last member
//!   arrives the barrier releases: every member draws its next phase (plus `barrier_us`). An
//!   unsynchronised (EP-like) thread just draws its next phase.
//! * A waiting vCPU that is on a CPU **spins**: it uses the CPU without progress. This is what
//!   makes coscheduling matter: a member descheduled mid-phase holds up the others.
//! * A vCPU put on a CPU that ran something else first pays `switch_us` on that CPU before it
//!   runs (the CPU does nothing useful meanwhile).
//! * Time advances to the next event: the earliest phase completion among computing vCPUs, the
//!   end of a switch, a CFS slice end, or the caller's horizon (a slice boundary). Between events
//!   nothing changes state, so the CPU-time accounting is integrated per state in O(1) and an
//!   event costs one scan over the CPUs; nothing allocates after construction.
//!
//! * Contention: with b CPUs computing, compute advances at speed 1 / (1 + contention ·
//!   (b − 1)/(cpus − 1)); when b changes, the completion times of the other computing CPUs are
//!   rescaled (an O(cpus) scan, like every event). With contention 0 the speed is always 1.
//!
//! # CFS model (policy `none`)
//!
//! Not Linux's CFS, a model of what matters here: every vCPU with work is placed statically
//! round-robin on the CPUs (the k-th working vCPU on CPU k mod cpus); each CPU round-robins its
//! vCPUs with a fixed slice; a vCPU that arrives at a barrier yields its CPU to another runnable
//! vCPU of the same CPU if there is one (spin-then-yield, as the bundled NPB barrier does), else
//! spins; when a barrier releases, a CPU spinning on another waiting vCPU switches to the
//! released one at once. No load balancing, no wakeup preemption, no vruntime.

use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::workload::Sampler;

const NONE: u32 = u32::MAX;
/// Events closer than this (µs) are handled together (float rounding of equal times).
const EPS: f64 = 1e-9;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum CpuState {
    /// No vCPU (or a reserved idle vCPU).
    Empty = 0,
    /// Paying the switch cost before its vCPU runs.
    Switching = 1,
    /// Its vCPU computes.
    Computing = 2,
    /// Its vCPU waits at a barrier.
    Spinning = 3,
}

struct Cfs {
    slice_us: f64,
    queue: Vec<Vec<u32>>,
    /// Index of each vCPU in its CPU's queue.
    qidx: Vec<u32>,
    home: Vec<u32>,
    slice_end: Vec<f64>,
}

pub(crate) struct Engine {
    pub now: f64,
    rng: StdRng,
    sampler: Sampler,
    stretch: f64,
    barrier_us: f64,
    switch_us: f64,
    contention: f64,
    /// Current compute speed (see the module doc).
    speed: f64,
    // Per vCPU.
    inst_of: Vec<u32>,
    remaining: Vec<f64>,
    waiting: Vec<bool>,
    on_cpu: Vec<u32>,
    pub thread_phases: Vec<u64>,
    // Per CPU.
    cur: Vec<u32>,
    state: Vec<CpuState>,
    active_at: Vec<f64>,
    done_at: Vec<f64>,
    next: Vec<f64>,
    cfs: Option<Cfs>,
    // Per instance.
    members: Vec<Vec<u32>>,
    sync: Vec<bool>,
    arrived: Vec<u32>,
    pub phases: Vec<u64>,
    sched_count: Vec<u32>,
    sched_since: Vec<f64>,
    /// Member-µs during which members were on a CPU.
    pub sched_time: Vec<f64>,
    /// Member-µs during which all members were on CPUs together.
    pub corun_time: Vec<f64>,
    // Accounting.
    n_state: [u32; 4],
    /// CPU-µs spent in each [`CpuState`].
    pub cpu_time: [f64; 4],
    pub events: u64,
}

pub(crate) struct EngineConfig<'a> {
    pub cpus: usize,
    /// Instance of each global vCPU (`None`: idle).
    pub instance_of: &'a [Option<usize>],
    /// Members and `sync` of each instance.
    pub instances: Vec<(Vec<usize>, bool)>,
    pub sampler: Sampler,
    pub seed: u64,
    /// Factor on every drawn phase (1 + detector overhead).
    pub stretch: f64,
    pub barrier_us: f64,
    pub switch_us: f64,
    pub contention: f64,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Engine {
        let nv = cfg.instance_of.len();
        let ni = cfg.instances.len();
        let mut e = Engine {
            now: 0.0,
            rng: StdRng::seed_from_u64(cfg.seed),
            sampler: cfg.sampler,
            stretch: cfg.stretch,
            barrier_us: cfg.barrier_us,
            switch_us: cfg.switch_us,
            contention: cfg.contention,
            speed: 1.0,
            inst_of: cfg
                .instance_of
                .iter()
                .map(|i| i.map_or(NONE, |i| i as u32))
                .collect(),
            remaining: vec![0.0; nv],
            waiting: vec![false; nv],
            on_cpu: vec![NONE; nv],
            thread_phases: vec![0; nv],
            cur: vec![NONE; cfg.cpus],
            state: vec![CpuState::Empty; cfg.cpus],
            active_at: vec![f64::INFINITY; cfg.cpus],
            done_at: vec![f64::INFINITY; cfg.cpus],
            next: vec![f64::INFINITY; cfg.cpus],
            cfs: None,
            members: cfg
                .instances
                .iter()
                .map(|(m, _)| m.iter().map(|&v| v as u32).collect())
                .collect(),
            sync: cfg.instances.iter().map(|&(_, s)| s).collect(),
            arrived: vec![0; ni],
            phases: vec![0; ni],
            sched_count: vec![0; ni],
            sched_since: vec![0.0; ni],
            sched_time: vec![0.0; ni],
            corun_time: vec![0.0; ni],
            n_state: [cfg.cpus as u32, 0, 0, 0],
            cpu_time: [0.0; 4],
            events: 0,
        };
        for v in 0..nv {
            if e.inst_of[v] != NONE {
                e.remaining[v] = e.draw();
            }
        }
        e
    }

    pub fn has_work(&self, v: usize) -> bool {
        self.inst_of.get(v).is_some_and(|&i| i != NONE)
    }

    fn draw(&mut self) -> f64 {
        self.sampler.sample(&mut self.rng) * self.stretch
    }

    fn advance(&mut self, to: f64) {
        let dt = to - self.now;
        if dt > 0.0 {
            for k in 0..4 {
                self.cpu_time[k] += dt * self.n_state[k] as f64;
            }
            self.now = to;
        }
    }

    fn set_state(&mut self, c: usize, s: CpuState) {
        let was = self.state[c];
        self.n_state[was as usize] -= 1;
        self.n_state[s as usize] += 1;
        self.state[c] = s;
        if self.contention > 0.0 && (was == CpuState::Computing) != (s == CpuState::Computing) {
            self.rescale(c);
        }
    }

    /// The number of computing CPUs changed (CPU `changed` is the one that changed; its own
    /// completion time is set by the caller): rescale every other computing CPU's.
    fn rescale(&mut self, changed: usize) {
        let n = self.cur.len();
        let b = self.n_state[CpuState::Computing as usize] as f64;
        let others = if n > 1 {
            (b - 1.0).max(0.0) / (n - 1) as f64
        } else {
            0.0
        };
        let speed = 1.0 / (1.0 + self.contention * others);
        if speed == self.speed {
            return;
        }
        let ratio = self.speed / speed;
        self.speed = speed;
        for c in 0..n {
            if c != changed && self.state[c] == CpuState::Computing {
                self.done_at[c] = self.now + (self.done_at[c] - self.now) * ratio;
                self.refresh(c);
            }
        }
    }

    fn refresh(&mut self, c: usize) {
        let own = match self.state[c] {
            CpuState::Switching => self.active_at[c],
            CpuState::Computing => self.done_at[c],
            _ => f64::INFINITY,
        };
        self.next[c] = match &self.cfs {
            Some(cfs) => own.min(cfs.slice_end[c]),
            None => own,
        };
    }

    /// Instance `i` gains (`+1`) or loses (`-1`) a member on a CPU (0: just account).
    fn sched_change(&mut self, i: usize, delta: i32) {
        let dt = self.now - self.sched_since[i];
        let n = self.sched_count[i];
        self.sched_time[i] += n as f64 * dt;
        if n as usize == self.members[i].len() {
            self.corun_time[i] += n as f64 * dt;
        }
        self.sched_since[i] = self.now;
        self.sched_count[i] = (n as i32 + delta) as u32;
    }

    fn place(&mut self, c: usize, v: u32) {
        debug_assert_eq!(self.cur[c], NONE);
        self.cur[c] = v;
        self.on_cpu[v as usize] = c as u32;
        self.sched_change(self.inst_of[v as usize] as usize, 1);
        if self.switch_us > 0.0 {
            self.set_state(c, CpuState::Switching);
            self.active_at[c] = self.now + self.switch_us;
            self.refresh(c);
        } else {
            self.activate(c);
        }
    }

    fn activate(&mut self, c: usize) {
        let v = self.cur[c] as usize;
        if self.waiting[v] {
            self.set_state(c, CpuState::Spinning);
        } else {
            self.set_state(c, CpuState::Computing);
            self.done_at[c] = self.now + self.remaining[v] / self.speed;
        }
        self.refresh(c);
    }

    fn remove(&mut self, c: usize) {
        let v = self.cur[c] as usize;
        if self.state[c] == CpuState::Computing {
            self.remaining[v] = (self.done_at[c] - self.now).max(0.0) * self.speed;
        }
        self.set_state(c, CpuState::Empty);
        self.cur[c] = NONE;
        self.on_cpu[v] = NONE;
        self.sched_change(self.inst_of[v] as usize, -1);
        self.refresh(c);
    }

    /// Run the vCPUs of a planned slice: `cpu[c]` is the vCPU for CPU `c`. vCPUs without work
    /// (idle, reserved by a full set) leave their CPU empty. Returns how many such reserved
    /// CPUs there are.
    pub fn apply(&mut self, cpu: &[Option<usize>]) -> usize {
        let mut reserved = 0;
        let want = |e: &Engine, c: usize| match cpu[c] {
            Some(v) if e.has_work(v) => v as u32,
            _ => NONE,
        };
        for (c, &slot) in cpu.iter().enumerate() {
            if slot.is_some_and(|v| !self.has_work(v)) {
                reserved += 1;
            }
            if self.cur[c] != NONE && self.cur[c] != want(self, c) {
                self.remove(c);
            }
        }
        for c in 0..cpu.len() {
            let w = want(self, c);
            if w != NONE && self.cur[c] != w {
                self.place(c, w);
            }
        }
        reserved
    }

    /// Start the CFS model (see the module documentation) at time 0.
    pub fn start_cfs(&mut self, slice_us: f64) {
        let cpus = self.cur.len();
        let nv = self.inst_of.len();
        let mut cfs = Cfs {
            slice_us,
            queue: vec![Vec::new(); cpus],
            qidx: vec![0; nv],
            home: vec![NONE; nv],
            slice_end: vec![f64::INFINITY; cpus],
        };
        let mut k = 0;
        for v in 0..nv {
            if self.has_work(v) {
                let c = k % cpus;
                cfs.qidx[v] = cfs.queue[c].len() as u32;
                cfs.home[v] = c as u32;
                cfs.queue[c].push(v as u32);
                k += 1;
            }
        }
        for c in 0..cpus {
            if !cfs.queue[c].is_empty() {
                cfs.slice_end[c] = self.now + slice_us;
            }
        }
        let first: Vec<Option<u32>> = cfs.queue.iter().map(|q| q.first().copied()).collect();
        self.cfs = Some(cfs);
        for (c, v) in first.into_iter().enumerate() {
            if let Some(v) = v {
                self.place(c, v);
            }
        }
    }

    /// Handle every event up to and including `horizon`, then advance the clock to it.
    pub fn run_until(&mut self, horizon: f64) {
        loop {
            let mut te = f64::INFINITY;
            for &x in &self.next {
                if x < te {
                    te = x;
                }
            }
            if te > horizon {
                self.advance(horizon);
                return;
            }
            self.advance(te);
            let lim = te + EPS;
            for c in 0..self.next.len() {
                if self.next[c] <= lim {
                    self.handle(c, lim);
                }
            }
        }
    }

    fn handle(&mut self, c: usize, lim: f64) {
        self.events += 1;
        match self.state[c] {
            CpuState::Switching if self.active_at[c] <= lim => self.activate(c),
            CpuState::Computing if self.done_at[c] <= lim => self.complete(c),
            _ => {}
        }
        if self.cfs.as_ref().is_some_and(|f| f.slice_end[c] <= lim) {
            self.cfs_rotate(c);
        }
    }

    fn complete(&mut self, c: usize) {
        let v = self.cur[c] as usize;
        let i = self.inst_of[v] as usize;
        self.thread_phases[v] += 1;
        if !self.sync[i] {
            self.remaining[v] = self.draw();
            self.done_at[c] = self.now + self.remaining[v] / self.speed;
            self.refresh(c);
            return;
        }
        self.waiting[v] = true;
        self.remaining[v] = 0.0;
        self.set_state(c, CpuState::Spinning);
        self.refresh(c);
        self.arrived[i] += 1;
        if self.arrived[i] as usize == self.members[i].len() {
            self.release(i);
        } else if self.cfs.is_some() {
            self.cfs_switch_from(c);
        }
    }

    fn release(&mut self, i: usize) {
        self.arrived[i] = 0;
        self.phases[i] += 1;
        let members = std::mem::take(&mut self.members[i]);
        for &m in &members {
            let m = m as usize;
            self.waiting[m] = false;
            self.remaining[m] = self.draw() + self.barrier_us;
            let c = self.on_cpu[m];
            if c != NONE && self.state[c as usize] == CpuState::Spinning {
                let c = c as usize;
                self.set_state(c, CpuState::Computing);
                self.done_at[c] = self.now + self.remaining[m] / self.speed;
                self.refresh(c);
            }
        }
        if self.cfs.is_some() {
            // A CPU spinning on another waiting vCPU switches to a released member at once.
            for &m in &members {
                if self.on_cpu[m as usize] != NONE {
                    continue;
                }
                let h = self.cfs.as_ref().map_or(0, |f| f.home[m as usize] as usize);
                if self.state[h] == CpuState::Spinning {
                    self.cfs_switch(h, m);
                }
            }
        }
        self.members[i] = members;
    }

    /// CFS: CPU `c` runs `v` from now, with a fresh slice.
    fn cfs_switch(&mut self, c: usize, v: u32) {
        self.remove(c);
        if let Some(f) = self.cfs.as_mut() {
            f.slice_end[c] = self.now + f.slice_us;
        }
        self.place(c, v);
    }

    /// The next runnable vCPU in CPU `c`'s queue after the current one, if any.
    fn cfs_next_runnable(&self, c: usize) -> Option<u32> {
        let f = self.cfs.as_ref()?;
        let q = &f.queue[c];
        let at = if self.cur[c] == NONE {
            q.len() - 1
        } else {
            f.qidx[self.cur[c] as usize] as usize
        };
        (1..q.len())
            .map(|k| q[(at + k) % q.len()])
            .find(|&v| !self.waiting[v as usize])
    }

    /// CFS: the vCPU on `c` arrived at a barrier: yield to another runnable vCPU if any.
    fn cfs_switch_from(&mut self, c: usize) {
        if let Some(v) = self.cfs_next_runnable(c) {
            self.cfs_switch(c, v);
        }
    }

    /// CFS: the slice of CPU `c` ended: the next runnable vCPU, else keep the current one.
    fn cfs_rotate(&mut self, c: usize) {
        match self.cfs_next_runnable(c) {
            Some(v) => self.cfs_switch(c, v),
            None => {
                if let Some(f) = self.cfs.as_mut() {
                    f.slice_end[c] = self.now + f.slice_us;
                }
                self.refresh(c);
            }
        }
    }

    /// Close the per-instance accounting at the current time.
    pub fn finish(&mut self) {
        for i in 0..self.members.len() {
            self.sched_change(i, 0);
        }
    }
}
