//! The anticipatory synchronous read (paper §2, "SSD Case Study": the device layer predicts each
//! synchronous I/O's completion from its type and size and wakes the requester's CPU just
//! before it, so the waiting application gets a prompt response without keeping the CPU awake
//! for the whole I/O).
//!
//! In user space the requester cannot be blocked inside `read` and woken early by the kernel, so
//! [`AnticipatoryReader`] issues the synchronous read on a helper thread (which blocks in
//! `pread`) and lets the requesting thread choose how to wait for it ([`Policy`]):
//!
//! * `default` — block on the completion futex until the helper signals it (what a blocking
//!   `read` gives: the requester's CPU may sleep and must be woken);
//! * `awake` — spin for the whole I/O (the requester's CPU never sleeps: the paper's "disable
//!   all CPU sleeps" line);
//! * `anticipatory` — block until `predicted − margin` (a timed wake-up), then spin until the
//!   completion flag. The prediction comes from [`crate::linear::CompletionPredictor`]; until
//!   it has enough exact samples the requester spins (bootstrap).
//!
//! Devices ([`Device`]): [`FileDevice`] reads a real file with `O_DIRECT` (4 KiB-aligned buffer
//! and offsets; everything it yields is *measured*), [`EmulatedDevice`] delivers completions on
//! the schedule of a documented [`ServiceModel`] (everything it yields is *emulated*). The
//! emulated device exists because this host caches the virtual disk (measured-here notes: a
//! freshly written file reads at ~55 µs; a never-read one at up to 18.7 ms on first touch), so
//! a file alone is neither a stable nor an SSD-like device.
//!
//! Placement matters (`preheat io bench --pin auto`): for a file the helper runs on the
//! requester's CPU, because it stands in for the requester's own blocked `read` — the disk
//! completion then wakes the CPU the policy keeps awake or lets sleep, as in the paper (on our
//! VMs the virtio-blk interrupt is also delivered to CPU 1, the requester's). The emulated
//! device's thread is the device, so it runs on the other CPU and its completion is a
//! cross-CPU wake-up, like a device interrupt.
//!
//! Differences from the paper: the helper-thread hop adds one thread wake-up on submission
//! (reported per request as `dispatch`), equally for all policies; the early wake-up is a futex
//! timeout of the requesting thread, not a kernel hrtimer that keeps the CPU out of sleep for a
//! duration; the spinning requester yields every few µs so a co-located helper runs at once.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;

use preheat_engine::time::now_ns;

use crate::linear::{CompletionPredictor, Observation, OpKind, PredictorConfig};
use crate::wait::{self, Completion, WaitPolicy};

/// O_DIRECT alignment (offsets, lengths and buffer addresses).
pub const ALIGN: usize = 4096;

/// Whether a number comes from real hardware or from the emulated device's model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Label {
    Measured,
    Emulated,
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Measured => "measured",
            Label::Emulated => "emulated",
        }
    }
}

/// Service-time model of the emulated SSD:
///
/// `service = (base + per_kib · size_KiB) · exp(σ·Z − σ²/2)`, `Z ~ N(0, 1)`
///
/// i.e. the linear model of the measured-here notes (~60 µs + 1.0 µs/KiB on this host's
/// virtual disk) with multiplicative, mean-preserving lognormal jitter: the mean service time
/// is exactly `base + per_kib · size_KiB`, the coefficient of variation is
/// `sqrt(exp(σ²) − 1)` (≈ σ for small σ; 0.1 by default).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ServiceModel {
    pub base_ns: f64,
    pub per_kib_ns: f64,
    pub sigma: f64,
}

impl Default for ServiceModel {
    fn default() -> Self {
        Self {
            base_ns: 60_000.0,
            per_kib_ns: 1_000.0,
            sigma: 0.1,
        }
    }
}

impl ServiceModel {
    /// Mean service time of an operation of `len` bytes, ns.
    pub fn mean_ns(&self, len: usize) -> f64 {
        self.base_ns + self.per_kib_ns * len as f64 / 1024.0
    }

    /// One sampled service time, ns.
    pub fn sample_ns(&self, len: usize, rng: &mut impl Rng) -> f64 {
        let s = self.sigma.max(0.0);
        self.mean_ns(len) * (s * std_normal(rng) - s * s / 2.0).exp()
    }
}

/// Standard normal variate (Box–Muller).
pub fn std_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.gen::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// One operation handed to a device.
#[derive(Clone, Copy, Debug)]
pub struct IoOp {
    pub kind: OpKind,
    pub offset: u64,
    pub len: usize,
    /// When the requester submitted it (`CLOCK_MONOTONIC` ns).
    pub submit_ns: u64,
}

/// What a device reports for one operation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Served {
    pub bytes: usize,
    /// The emulated device's sampled service time (ns); `None` for real devices.
    pub modeled_ns: Option<u64>,
}

/// A device that serves one synchronous operation at a time on the helper thread.
pub trait Device: Send + 'static {
    fn label(&self) -> Label;
    fn describe(&self) -> String;
    /// Bytes addressable by offsets.
    fn capacity(&self) -> u64;
    /// Perform `op` synchronously; returns when it is complete.
    fn serve(&mut self, op: &IoOp) -> io::Result<Served>;
}

/// A heap buffer whose usable slice starts at an `align`-aligned address (a `Vec<u8>`
/// oversized by `align` and sliced at the first aligned offset: no unsafe allocation).
pub struct AlignedBuf {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize, align: usize) -> Self {
        let align = align.max(1);
        let raw = vec![0u8; len + align];
        let off = raw.as_ptr().align_offset(align);
        assert!(off < align, "cannot align a byte buffer");
        Self { raw, off, len }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.off..self.off + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + self.len]
    }
}

/// A real file read (and written) with `O_DIRECT`, so every operation goes to the (virtual)
/// disk instead of the guest page cache.
pub struct FileDevice {
    file: File,
    path: PathBuf,
    size: u64,
    buf: AlignedBuf,
}

impl FileDevice {
    /// Open `path` read-only with `O_DIRECT` for operations of up to `max_len` bytes (writes
    /// then fail with `EBADF`; see [`Self::open_rw`]).
    pub fn open(path: &Path, max_len: usize) -> io::Result<Self> {
        Self::open_with(path, max_len, false)
    }

    /// Open `path` for reading and writing with `O_DIRECT`.
    pub fn open_rw(path: &Path, max_len: usize) -> io::Result<Self> {
        Self::open_with(path, max_len, true)
    }

    fn open_with(path: &Path, max_len: usize, write: bool) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "opening {} with O_DIRECT: {e} (tmpfs and some filesystems refuse \
                         O_DIRECT; put the file on a disk-backed filesystem)",
                        path.display()
                    ),
                )
            })?;
        let size = file.metadata()?.len();
        let max_len = max_len.div_ceil(ALIGN).max(1) * ALIGN;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            size,
            buf: AlignedBuf::new(max_len, ALIGN),
        })
    }
}

impl Device for FileDevice {
    fn label(&self) -> Label {
        Label::Measured
    }

    fn describe(&self) -> String {
        format!(
            "file {} ({} MiB, O_DIRECT)",
            self.path.display(),
            self.size >> 20
        )
    }

    fn capacity(&self) -> u64 {
        self.size
    }

    fn serve(&mut self, op: &IoOp) -> io::Result<Served> {
        if op.len > self.buf.len || op.len & (ALIGN - 1) != 0 || op.offset & (ALIGN as u64 - 1) != 0
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "O_DIRECT needs {ALIGN}-byte aligned offset and length ≤ {} (got {} @ {})",
                    self.buf.len, op.len, op.offset
                ),
            ));
        }
        let bytes = match op.kind {
            OpKind::Read => {
                let buf = &mut self.buf.as_mut_slice()[..op.len];
                self.file.read_at(buf, op.offset)?
            }
            OpKind::Write => self
                .file
                .write_at(&self.buf.as_slice()[..op.len], op.offset)?,
        };
        Ok(Served {
            bytes,
            modeled_ns: None,
        })
    }
}

/// Create `path` with `bytes` of pseudo-random content (unless it already exists) and return
/// its size. Writes through the page cache and syncs; the host may still cache it (see the
/// module docs).
pub fn ensure_test_file(path: &Path, bytes: u64, seed: u64) -> io::Result<u64> {
    if let Ok(m) = std::fs::metadata(path) {
        return Ok(m.len());
    }
    let tmp = path.with_extension("partial");
    let mut f = File::create(&tmp)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = bytes.div_ceil(ALIGN as u64) * ALIGN as u64;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        rng.fill_bytes(&mut chunk[..n]);
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    Ok(std::fs::metadata(path)?.len())
}

/// The emulated SSD: a service time is sampled from [`ServiceModel`] for every operation, and
/// the completion is delivered at `submit + service` by the device (helper) thread, which
/// sleeps while more than `sleep_above_ns` remain and spins for the rest. Timing from the
/// submit time (not from when the helper woke) keeps the helper's own wake-up lag out of the
/// model unless it exceeds the service time.
pub struct EmulatedDevice {
    model: ServiceModel,
    rng: StdRng,
    capacity: u64,
    sleep_above_ns: u64,
}

impl EmulatedDevice {
    pub fn new(model: ServiceModel, seed: u64) -> Self {
        Self {
            model,
            rng: StdRng::seed_from_u64(seed),
            capacity: 1 << 30,
            sleep_above_ns: 200_000,
        }
    }

    pub fn model(&self) -> ServiceModel {
        self.model
    }
}

impl Device for EmulatedDevice {
    fn label(&self) -> Label {
        Label::Emulated
    }

    fn describe(&self) -> String {
        format!(
            "emulated SSD: service = ({:.1} µs + {:.2} µs/KiB) · lognormal(σ={})",
            self.model.base_ns / 1e3,
            self.model.per_kib_ns / 1e3,
            self.model.sigma
        )
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn serve(&mut self, op: &IoOp) -> io::Result<Served> {
        let service = self.model.sample_ns(op.len, &mut self.rng).max(0.0) as u64;
        wait::pause_until(op.submit_ns.saturating_add(service), self.sleep_above_ns);
        Ok(Served {
            bytes: op.len,
            modeled_ns: Some(service),
        })
    }
}

/// How the requester waits for its read (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Default,
    Awake,
    Anticipatory,
    /// Block until completion, but ask the wake planner (crate preheat-wake) for a window on
    /// the requester's CPU from the predicted completion minus the margin: the CPU stays out of
    /// deep idle then, so the completion wakes the requester quickly without it spinning.
    Window,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Default => "default",
            Policy::Awake => "awake",
            Policy::Anticipatory => "anticipatory",
            Policy::Window => "window",
        }
    }
}

/// What feeds the online model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Feedback {
    /// Only what the requester itself saw: exact when it was spinning at completion, censored
    /// (`latency ≤ wake − submit`) when its wake-up found the read done. The brief's and the
    /// notes' setting; a user-space library without device timestamps.
    Requester,
    /// The helper's completion timestamp (like an interrupt time in the device layer): always
    /// exact; a late wake-up only backs the margin off.
    Device,
}

/// Length of a [`Policy::Window`] planner window (from the predicted completion minus margin).
pub const WINDOW_NS: u64 = 300_000;

/// Configuration of an [`AnticipatoryReader`].
#[derive(Clone, Copy, Debug)]
pub struct ReaderConfig {
    pub policy: Policy,
    pub feedback: Feedback,
    pub predictor: PredictorConfig,
    /// Pin the helper thread to this CPU.
    pub helper_cpu: Option<usize>,
    /// A planned wake-up that left less than this much spinning before the completion counts
    /// as late for the margin (the sample itself is exact): a timer wake-up that overlaps the
    /// completion costs the same CPU exit latency as being woken by it.
    pub min_spin_ns: u64,
}

impl Default for ReaderConfig {
    fn default() -> Self {
        Self {
            policy: Policy::Anticipatory,
            feedback: Feedback::Requester,
            predictor: PredictorConfig::default(),
            helper_cpu: None,
            min_spin_ns: 10_000,
        }
    }
}

/// Everything recorded about one request. Times are ns relative to submission.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ReadRecord {
    pub kind: OpKind,
    pub offset: u64,
    pub len: usize,
    pub bytes: usize,
    /// Submit → the requester saw the completion.
    pub latency_ns: u64,
    /// The requester's user-visible awake time (spin plus time since its last wake-up).
    pub awake_ns: u64,
    /// The requester's last wake-up found the read already done.
    pub censored: bool,
    pub blocked: bool,
    /// Submit → the helper started the read (the submission hop).
    pub dispatch_ns: u64,
    /// Submit → the helper saw the read complete.
    pub device_ns: u64,
    /// The emulated device's sampled service time.
    pub modeled_ns: Option<u64>,
    /// For `anticipatory`: the planned block duration.
    pub planned_wake_ns: Option<u64>,
    /// Submit → the requester's last return from blocking (0 if it never blocked).
    pub resumed_ns: u64,
    /// For `anticipatory`: no model yet, so the requester spun.
    pub bootstrap: bool,
}

struct Shared {
    completion: Completion,
    result: Mutex<Option<io::Result<Served>>>,
}

/// Synchronous reads on a helper thread, waited for by the calling thread according to a
/// [`Policy`] and an online [`CompletionPredictor`].
pub struct AnticipatoryReader {
    tx: Option<mpsc::Sender<IoOp>>,
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    cfg: ReaderConfig,
    predictor: CompletionPredictor,
    label: Label,
    capacity: u64,
    describe: String,
    /// For [`Policy::Window`]: the planner connection and the requester's CPU.
    window: WindowClient,
    /// Window requests the planner refused or that failed.
    pub window_errors: u64,
}

impl AnticipatoryReader {
    /// Use `client` (a wake planner) for [`Policy::Window`], asking for windows on `cpu`.
    pub fn set_window_client(&mut self, client: preheat_wake::client::WakeClient, cpu: u32) {
        self.window = Some((client, cpu));
    }

    /// Start the helper thread that owns `device`.
    pub fn new(device: Box<dyn Device>, cfg: ReaderConfig) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            completion: Completion::new(),
            result: Mutex::new(None),
        });
        let (tx, rx) = mpsc::channel::<IoOp>();
        let label = device.label();
        let capacity = device.capacity();
        let describe = device.describe();
        let s2 = shared.clone();
        let helper_cpu = cfg.helper_cpu;
        let handle = std::thread::Builder::new()
            .name("preheat-io-helper".into())
            .spawn(move || helper_loop(device, rx, s2, helper_cpu))?;
        Ok(Self {
            tx: Some(tx),
            shared,
            handle: Some(handle),
            predictor: CompletionPredictor::new(cfg.predictor),
            cfg,
            label,
            capacity,
            describe,
            window: None,
            window_errors: 0,
        })
    }

    pub fn label(&self) -> Label {
        self.label
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn describe(&self) -> &str {
        &self.describe
    }

    pub fn policy(&self) -> Policy {
        self.cfg.policy
    }

    pub fn predictor(&self) -> &CompletionPredictor {
        &self.predictor
    }

    /// One synchronous read of `len` bytes at `offset`.
    pub fn read(&mut self, offset: u64, len: usize) -> io::Result<ReadRecord> {
        self.submit(OpKind::Read, offset, len)
    }

    /// One synchronous operation: submit it to the helper, wait by the policy, update the
    /// model with what was learned.
    pub fn submit(&mut self, kind: OpKind, offset: u64, len: usize) -> io::Result<ReadRecord> {
        // Planned before submitting: with a co-located helper, work done after submitting
        // would delay the start of the read.
        let planned = match self.cfg.policy {
            Policy::Anticipatory | Policy::Window => self
                .predictor
                .wake_delay_ns(kind, len as u64)
                .map(|d| d as u64),
            _ => None,
        };
        let c = &self.shared.completion;
        c.reset();
        let submit = now_ns();
        let op = IoOp {
            kind,
            offset,
            len,
            submit_ns: submit,
        };
        let gone = || io::Error::new(io::ErrorKind::BrokenPipe, "I/O helper thread is gone");
        self.tx
            .as_ref()
            .ok_or_else(gone)?
            .send(op)
            .map_err(|_| gone())?;
        let (policy, bootstrap) = match (self.cfg.policy, planned) {
            (Policy::Default, _) => (WaitPolicy::Block, false),
            (Policy::Awake, _) => (WaitPolicy::Spin, false),
            (Policy::Anticipatory, Some(d)) => (WaitPolicy::BlockUntil(submit + d), false),
            (Policy::Anticipatory, None) => (WaitPolicy::Spin, true),
            (Policy::Window, planned) => {
                if let Some(d) = planned {
                    request_window(&mut self.window, &mut self.window_errors, submit + d);
                }
                (WaitPolicy::Block, planned.is_none())
            }
        };
        let o = wait::wait(c, policy, submit);
        if o.abandoned {
            return Err(gone());
        }
        let served = self
            .shared
            .result
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_else(|| Err(gone()))?;
        let latency = o.seen_ns.saturating_sub(submit);
        let device = c.done_ns().saturating_sub(submit);
        let late =
            o.censored || (planned.is_some() && o.blocked && o.awake_ns() < self.cfg.min_spin_ns);
        let exact = match self.cfg.feedback {
            Feedback::Requester => latency as f64,
            Feedback::Device => device as f64,
        };
        // Replies of the planner, read now that the request is served (off the timed path).
        collect_window_replies(&mut self.window, &mut self.window_errors);
        // `window` always blocks until the completion: learn from the device's completion time.
        let obs = if self.cfg.policy == Policy::Window {
            Observation::Exact {
                latency_ns: device as f64,
            }
        } else if o.censored && self.cfg.feedback == Feedback::Requester {
            Observation::Censored {
                upper_bound_ns: o.resumed_ns.saturating_sub(submit) as f64,
            }
        } else if late {
            Observation::ExactLate { latency_ns: exact }
        } else {
            Observation::Exact { latency_ns: exact }
        };
        self.predictor.observe(kind, len as u64, obs);
        Ok(ReadRecord {
            kind,
            offset,
            len,
            bytes: served.bytes,
            latency_ns: latency,
            awake_ns: o.awake_ns(),
            censored: o.censored,
            blocked: o.blocked,
            dispatch_ns: c.started_ns().saturating_sub(submit),
            device_ns: device,
            modeled_ns: served.modeled_ns,
            planned_wake_ns: planned,
            resumed_ns: o.resumed_ns.saturating_sub(submit),
            bootstrap,
        })
    }
}

/// The planner connection of a [`Policy::Window`] reader and the requester's CPU.
type WindowClient = Option<(preheat_wake::client::WakeClient, u32)>;

/// [`Policy::Window`]: ask the planner (without waiting for its reply) to keep the requester's
/// CPU awake from `start_ns`; a failure, or no planner, is counted in `errors`.
fn request_window(window: &mut WindowClient, errors: &mut u64, start_ns: u64) {
    let Some((client, cpu)) = window.as_mut() else {
        *errors += 1;
        return;
    };
    let req = preheat_wake::WakeRequest {
        requester: "preheat-io".into(),
        cpus: vec![*cpu],
        start_ns,
        duration_ns: WINDOW_NS,
    };
    if client.request_nowait(&req).is_err() {
        *errors += 1;
    }
}

/// Count in `errors` the window requests the planner refused (or whose replies could not be
/// read).
fn collect_window_replies(window: &mut WindowClient, errors: &mut u64) {
    if let Some((client, _)) = window.as_mut() {
        match client.collect_replies() {
            Ok(refused) => *errors += refused as u64,
            Err(_) => *errors += 1,
        }
    }
}

impl Drop for AnticipatoryReader {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn helper_loop(
    mut device: Box<dyn Device>,
    rx: mpsc::Receiver<IoOp>,
    shared: Arc<Shared>,
    cpu: Option<usize>,
) {
    struct Dead(Arc<Shared>);
    impl Drop for Dead {
        fn drop(&mut self) {
            self.0.completion.mark_dead();
        }
    }
    let _dead = Dead(shared.clone());
    if let Some(cpu) = cpu {
        let _ = preheat_engine::os::pin_current_thread(cpu);
    }
    let _ = wait::set_own_timer_slack(1);
    while let Ok(op) = rx.recv() {
        shared.completion.mark_started(now_ns());
        let r = device.serve(&op);
        let done = now_ns();
        *shared.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        shared.completion.complete(done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_is_aligned() {
        for len in [1usize, 4096, 65536] {
            let mut b = AlignedBuf::new(len, ALIGN);
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.as_mut_slice().len(), len);
        }
    }

    #[test]
    fn model_mean_and_spread() {
        let m = ServiceModel::default();
        assert_eq!(m.mean_ns(4096), 64_000.0);
        let mut rng = StdRng::seed_from_u64(1);
        let n = 20_000;
        let xs: Vec<f64> = (0..n).map(|_| m.sample_ns(4096, &mut rng)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        assert!((mean / 64_000.0 - 1.0).abs() < 0.01, "mean {mean}");
        let logs: Vec<f64> = xs.iter().map(|x| x.ln()).collect();
        let lm = logs.iter().sum::<f64>() / n as f64;
        let sd = (logs.iter().map(|l| (l - lm).powi(2)).sum::<f64>() / n as f64).sqrt();
        assert!((sd - 0.1).abs() < 0.005, "log sd {sd}");
    }

    #[test]
    fn emulated_reader_all_policies() {
        for policy in [Policy::Default, Policy::Awake, Policy::Anticipatory] {
            let dev = EmulatedDevice::new(ServiceModel::default(), 7);
            let mut r = AnticipatoryReader::new(
                Box::new(dev),
                ReaderConfig {
                    policy,
                    predictor: PredictorConfig {
                        min_exact: 4,
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .unwrap();
            for i in 0..40u64 {
                let rec = r.read(i * 4096, 4096 << (i % 3)).unwrap();
                assert!(rec.latency_ns >= rec.modeled_ns.unwrap());
                assert!(rec.device_ns >= rec.modeled_ns.unwrap());
                match policy {
                    Policy::Default => assert!(rec.censored || !rec.blocked),
                    Policy::Awake => assert!(!rec.censored && !rec.blocked),
                    // Bootstrap spins, and spinning never yields censored samples.
                    Policy::Anticipatory => assert_eq!(rec.bootstrap, i < 4),
                    Policy::Window => assert!(rec.blocked || rec.censored),
                }
            }
        }
    }
}
