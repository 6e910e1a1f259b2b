//! The agent's own threads: spawned marked (hooks pass through), with their stacks and thread
//! ids registered (the probe and the communication detector leave them alone), and with their
//! bodies under `catch_unwind` (a panic disables the agent instead of taking the host down).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::log::{disable, panic_message};
use crate::{sys, track};

/// An address inside the stack of every agent thread (to exclude them from probe candidates).
static AGENT_STACKS: [AtomicU64; 512] = [const { AtomicU64::new(0) }; 512];
/// The kernel thread ids of the agent's threads.
static AGENT_TIDS: [AtomicU32; 512] = [const { AtomicU32::new(0) }; 512];
fn register_stack(addr: u64) {
    for s in AGENT_STACKS.iter() {
        if s.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            break;
        }
    }
    let tid = preheat_engine::os::gettid();
    for t in AGENT_TIDS.iter() {
        if t.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// Whether `tid` is one of the agent's own threads.
pub fn is_agent_tid(tid: u32) -> bool {
    tid != 0 && AGENT_TIDS.iter().any(|t| t.load(Ordering::Relaxed) == tid)
}

/// Addresses inside the agent's thread stacks.
pub fn agent_stack_addresses() -> Vec<u64> {
    AGENT_STACKS
        .iter()
        .map(|s| s.load(Ordering::Relaxed))
        .filter(|&a| a != 0)
        .collect()
}

/// Spawn one of the agent's own threads: marked (hooks pass through), stack registered, body
/// wrapped in `catch_unwind` (a panic disables the agent instead of taking the host down), and
/// every asynchronous signal blocked from its first instruction on (the mask is inherited from
/// the spawning thread, which blocks them just around the spawn). The host's signals then
/// always go to the host's threads: a host that blocks a signal everywhere to take it with
/// `sigwait`/`signalfd` (MariaDB's signal thread, for one) would otherwise get it delivered to
/// an agent thread, where its default action kills the process; and no host handler ever runs
/// on an agent thread. Fault signals stay unblocked ([`sys::block_async_signals`]).
///
/// Once the agent's threads have a file table of their own ([`crate::fdreg`]), only an agent
/// thread may spawn another (a thread shares its creator's table): from a host thread this
/// fails.
pub fn spawn_agent_thread<F>(name: String, f: F) -> std::io::Result<()>
where
    F: FnOnce() + Send + 'static,
{
    if crate::fdreg::private_table() && !track::is_agent_thread() {
        return Err(std::io::Error::other(format!(
            "agent thread {name}: spawned from a host thread, it would share the host's file \
             table, not the agent's"
        )));
    }
    let saved = sys::block_async_signals();
    let r = spawn_marked(name, f);
    if let Some(old) = saved {
        sys::restore_signal_mask(&old);
    }
    r
}

fn spawn_marked<F>(name: String, f: F) -> std::io::Result<()>
where
    F: FnOnce() + Send + 'static,
{
    let tname = name.clone();
    std::thread::Builder::new()
        .name(name)
        // Explicit, so std never consults RUST_MIN_STACK (the environment) here, which matters
        // in a fork child.
        .stack_size(512 * 1024)
        .spawn(move || {
            track::mark_agent_thread();
            let marker = 0u8;
            register_stack(std::hint::black_box(&marker) as *const u8 as u64);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            if let Err(p) = r {
                disable(format!(
                    "agent thread {tname} panicked: {}",
                    panic_message(&p)
                ));
            }
        })
        .map(|_| ())
}

/// Fork child: the parent's agent threads do not exist here.
pub fn reset_after_fork() {
    for s in AGENT_STACKS.iter() {
        s.store(0, Ordering::Relaxed);
    }
    for t in AGENT_TIDS.iter() {
        t.store(0, Ordering::Relaxed);
    }
}
