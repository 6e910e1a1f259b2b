//! The agent's own threads: spawned marked (hooks pass through), with their stacks and thread
//! ids registered (the probe and the communication detector leave them alone), and with their
//! bodies under `catch_unwind` (a panic disables the agent instead of taking the host down).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::log::{disable, panic_message};
use crate::{sys, track};

/// The stack block `[low, high)` of every agent thread (`high` 0 until it is known); see
/// [`own_memory`].
static AGENT_STACKS: [(AtomicU64, AtomicU64); 512] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; 512];
/// The kernel thread ids of the agent's threads.
static AGENT_TIDS: [AtomicU32; 512] = [const { AtomicU32::new(0) }; 512];
/// Where the C library cannot say (it always can on glibc), a window around an address in the
/// stack: the spawned size and its TLS below, a margin above.
const STACK_WINDOW_BELOW: u64 = 1 << 20;
const STACK_WINDOW_ABOVE: u64 = 64 << 10;

/// Register the calling (agent) thread: its stack block, `marker` an address inside it, and
/// its thread id.
fn register_stack(marker: u64) {
    let (low, high) = crate::sys::current_thread_stack()
        .filter(|&(l, h)| (l..h).contains(&marker))
        .unwrap_or((
            marker.saturating_sub(STACK_WINDOW_BELOW),
            marker.saturating_add(STACK_WINDOW_ABOVE),
        ));
    for (lo, hi) in AGENT_STACKS.iter() {
        if lo
            .compare_exchange(0, low.max(1), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            hi.store(high, Ordering::Release);
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

/// The agent threads' stack blocks, `[low, high)` (a thread registering right now may be
/// missing).
pub fn agent_stack_ranges() -> Vec<(u64, u64)> {
    AGENT_STACKS
        .iter()
        .map(|(lo, hi)| (lo.load(Ordering::Acquire), hi.load(Ordering::Acquire)))
        .filter(|&(lo, hi)| lo != 0 && hi > lo)
        .collect()
}

/// The agent's own memory now, as exact `[start, end)` ranges: its loaded image (code, data,
/// `.bss` with its tables) and its threads' stack blocks. The probe never counts it as the
/// server's (`control::ranges`); the communication detector never revokes it (`comm::sampler`).
///
/// Exact ranges, not whole mappings: the kernel merges an anonymous mapping with an adjacent one
/// of the same kind, so server memory can share a mapping with the agent's `.bss` or a thread
/// stack. Excluding whole mappings dropped such server memory from recordings (a 256 KiB region
/// of a test server went unrecorded in about 1 of 150 runs). Not for hooked paths (it allocates
/// and takes the loader's lock).
pub fn own_memory() -> Vec<(u64, u64)> {
    let mut own = crate::sys::object_image_ranges(own_memory as *const () as u64);
    own.extend(agent_stack_ranges());
    own
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
    for (lo, hi) in AGENT_STACKS.iter() {
        hi.store(0, Ordering::Relaxed);
        lo.store(0, Ordering::Relaxed);
    }
    for t in AGENT_TIDS.iter() {
        t.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_memory_holds_this_code_and_an_agent_threads_stack() {
        let code = own_memory as *const () as u64;
        let (tx, rx) = std::sync::mpsc::channel();
        spawn_agent_thread("own-test".into(), move || {
            let marker = 0u8;
            let at = std::hint::black_box(&marker) as *const u8 as u64;
            let _ = tx.send((at, own_memory()));
            // Stay alive until the test has looked (the slot is not freed on exit anyway).
            std::thread::sleep(std::time::Duration::from_millis(50));
        })
        .unwrap();
        let (stack_addr, own) = rx.recv().unwrap();
        let holds = |a: u64| own.iter().any(|&(s, e)| (s..e).contains(&a));
        assert!(holds(code), "the agent's code is not in {own:x?}");
        assert!(
            holds(stack_addr),
            "the agent thread's stack is not in {own:x?}"
        );
        // Exact: a stack block of the spawned size (512 KiB) plus its TLS, not a whole region.
        let (s, e) = own
            .iter()
            .copied()
            .find(|&(s, e)| (s..e).contains(&stack_addr))
            .unwrap();
        assert!(
            e - s <= 2 << 20,
            "stack range {s:x}..{e:x} is not one thread's block"
        );
    }
}
