//! [`ForkCell`]: a value behind a try-lock that a fork child can always take back, so the fork
//! handlers never wait for a lock.
//!
//! # Why not a `Mutex` and the classic atfork protocol
//!
//! The classic protocol locks every such mutex in the prepare handler (so `fork` never copies it
//! locked) and unlocks it in the parent and child handlers. The forking thread then *waits* in
//! `fork` for whoever holds the lock, while glibc holds its atfork lock and — if the host's
//! allocator registered its own prepare handler after ours (jemalloc, tcmalloc do) — every
//! malloc arena lock. A holder that allocates inside its critical section (cloning a `String`
//! for `Status`) then waits for the forking thread, which waits for it: the host hangs in `fork`.
//!
//! A `ForkCell` is never taken by the fork handlers. Its owner word holds the address of the
//! owning thread's thread-local marker (0 = free). In the child only the forking thread exists,
//! and its thread-local block sits at the same address as in the parent, so the child handler
//! can tell the two cases apart: the cell is held by a thread that does not exist here (free it
//! and forget the value, which that thread may have been changing), or by the forking thread
//! itself, further up its own stack (only possible if a signal handler forked on an agent thread
//! inside a critical section — agent threads block asynchronous signals, so only a fault's
//! handler could; that critical section resumes after `fork` returns and frees the cell itself,
//! so the child leaves it alone).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

thread_local! {
    /// Its address identifies the calling thread (const-initialised, no destructor: a plain
    /// TLS slot, valid for the thread's whole life).
    static MARK: u8 = const { 0 };
}

/// An identifier of the calling thread that survives `fork` for the forking thread (0 if the
/// thread's TLS is being torn down).
fn me() -> usize {
    MARK.try_with(|m| m as *const u8 as usize).unwrap_or(0)
}

/// A value that one thread at a time may use; see the module docs.
pub struct ForkCell<T> {
    /// 0: free; else the owning thread's [`me`].
    owner: AtomicUsize,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through `try_with`/`with`, which give one thread at a time
// (the one whose id is in `owner`, set by a successful compare-exchange with Acquire and cleared
// with Release) a `&mut T`; so sharing the cell between threads needs only `T: Send`.
unsafe impl<T: Send> Sync for ForkCell<T> {}

/// Frees the cell when the critical section ends (also if `f` panics).
struct Held<'a>(&'a AtomicUsize);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.store(0, Ordering::Release);
    }
}

impl<T> ForkCell<T> {
    pub const fn new(value: T) -> ForkCell<T> {
        ForkCell {
            owner: AtomicUsize::new(0),
            value: UnsafeCell::new(value),
        }
    }

    /// Run `f` on the value if nobody holds it; `None` (without waiting) if someone does.
    pub fn try_with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let me = me();
        if me == 0
            || self
                .owner
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return None;
        }
        let _held = Held(&self.owner);
        // SAFETY: our compare-exchange made us the only owner until `_held` is dropped, and no
        // other `&mut T` exists outside an owner's critical section.
        Some(f(unsafe { &mut *self.value.get() }))
    }

    /// Run `f` on the value, sleeping in between attempts while someone else holds it. Only for
    /// the agent's own threads (never a hooked path); every critical section is short.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut f = Some(f);
        loop {
            if let Some(Some(r)) = self.try_with(|v| f.take().map(|f| f(v))) {
                return r;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Fork child: put `fresh` in the cell and free it, forgetting (leaking) the parent's value
    /// without reading it — unless the forking thread itself holds the cell (see the module
    /// docs), in which case nothing changes.
    ///
    /// # Safety
    /// Only from a `pthread_atfork` child handler: the process has exactly one thread (the
    /// forking one), so nobody else can be inside a critical section.
    pub unsafe fn reclaim_in_fork_child(&self, fresh: T) {
        let owner = self.owner.load(Ordering::Acquire);
        if owner != 0 && owner == me() {
            return;
        }
        // SAFETY: one thread (caller), and it is not inside a critical section of this cell
        // (owner is not this thread), so no reference to the value exists. The old value may be
        // half-updated by a parent thread that does not exist here: overwritten, never dropped.
        unsafe { std::ptr::write(self.value.get(), fresh) };
        self.owner.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_with_never_waits_and_with_does() {
        static CELL: ForkCell<u32> = ForkCell::new(1);
        assert_eq!(CELL.try_with(|v| *v), Some(1));
        let (tx, rx) = std::sync::mpsc::channel();
        let (tx2, rx2) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            CELL.with(|v| {
                *v = 2;
                tx.send(()).unwrap();
                rx2.recv().unwrap();
            })
        });
        rx.recv().unwrap();
        assert_eq!(CELL.try_with(|v| *v), None, "held by the other thread");
        tx2.send(()).unwrap();
        assert_eq!(CELL.with(|v| *v), 2);
        holder.join().unwrap();
        // Reentrant use from the holder itself is refused, not a deadlock.
        assert_eq!(CELL.with(|_| CELL.try_with(|v| *v)), None);
    }
}
