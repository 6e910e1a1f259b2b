//! In-memory item storage with memcached's expiry semantics.
//!
//! A plain `HashMap<Vec<u8>, Item>`; there is no memory limit and no
//! eviction (the server is meant for demos and tests with a known working
//! set). Expiry follows memcached:
//!
//! * `exptime == 0`: never expires;
//! * `0 < exptime <= 30 days` (2 592 000 s): seconds from now;
//! * `exptime > 30 days`: an absolute Unix timestamp;
//! * `exptime < 0`: already expired (the `set` succeeds but the item is
//!   immediately invisible, so it effectively deletes the key).
//!
//! Expired items are removed lazily when a lookup finds them. `flush_all`
//! with a delay schedules a full flush for that moment. Time is injected with
//! [`Store::set_now`] (once per event-loop iteration) so the store itself
//! never reads the clock on the hot path and tests can move time forward.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Relative expiry times above this are absolute Unix times (memcached's
/// `REALTIME_MAXDELTA`).
const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// One stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Opaque client flags, returned verbatim by `get`.
    pub flags: u32,
    /// The value bytes.
    pub data: Vec<u8>,
    expires_at: Option<Instant>,
}

impl Item {
    fn is_expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }
}

/// Result of [`Store::get`].
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// Present and live.
    Hit(&'a Item),
    /// Not present.
    Miss,
    /// Present but expired; the caller should call [`Store::remove_expired`]
    /// and treat it as a miss.
    Expired,
}

/// When an item should expire, resolved from a protocol `exptime`.
enum Expiry {
    Never,
    At(Instant),
    Past,
}

/// The key-value store.
#[derive(Debug)]
pub struct Store {
    map: HashMap<Vec<u8>, Item>,
    /// Sum of key and value lengths of all items (including expired ones not
    /// yet reclaimed, as in memcached's `bytes` stat).
    bytes: usize,
    now: Instant,
    flush_at: Option<Instant>,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    /// An empty store whose clock reads "now".
    pub fn new() -> Store {
        Store {
            map: HashMap::new(),
            bytes: 0,
            now: Instant::now(),
            flush_at: None,
        }
    }

    /// Advances the store's clock; also performs a delayed `flush_all` that
    /// has come due.
    pub fn set_now(&mut self, now: Instant) {
        self.now = now;
        if self.flush_at.is_some_and(|t| t <= now) {
            self.flush_at = None;
            self.clear();
        }
    }

    /// Number of items (including expired ones not yet reclaimed).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Total key + value bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Looks `key` up without modifying the store.
    pub fn get(&self, key: &[u8]) -> Lookup<'_> {
        match self.map.get(key) {
            None => Lookup::Miss,
            Some(item) if item.is_expired(self.now) => Lookup::Expired,
            Some(item) => Lookup::Hit(item),
        }
    }

    /// Reclaims `key` after [`Store::get`] reported it expired.
    pub fn remove_expired(&mut self, key: &[u8]) {
        if matches!(self.get(key), Lookup::Expired) {
            self.remove(key);
        }
    }

    /// Stores `data` under `key` (memcached `set` semantics).
    pub fn set(&mut self, key: &[u8], flags: u32, exptime: i32, data: &[u8]) {
        let expires_at = match self.expiry(exptime) {
            Expiry::Never => None,
            Expiry::At(t) => Some(t),
            Expiry::Past => {
                self.remove(key);
                return;
            }
        };
        match self.map.get_mut(key) {
            Some(item) => {
                self.bytes = self.bytes - item.data.len() + data.len();
                // Reuse the old allocation unless it would waste a lot of memory.
                if item.data.capacity() >= data.len() && item.data.capacity() <= 2 * data.len() + 64
                {
                    item.data.clear();
                    item.data.extend_from_slice(data);
                } else {
                    item.data = data.to_vec();
                }
                item.flags = flags;
                item.expires_at = expires_at;
            }
            None => {
                self.bytes += key.len() + data.len();
                let item = Item {
                    flags,
                    data: data.to_vec(),
                    expires_at,
                };
                self.map.insert(key.to_vec(), item);
            }
        }
    }

    /// Deletes `key`; returns whether a live item was removed.
    pub fn delete(&mut self, key: &[u8]) -> bool {
        let live = matches!(self.get(key), Lookup::Hit(_));
        self.remove(key);
        live
    }

    /// `flush_all [delay]`: drop everything now, or when `delay` elapses
    /// (`delay` is interpreted like an `exptime`).
    pub fn flush(&mut self, delay: i32) {
        match self.expiry(delay) {
            Expiry::At(t) => self.flush_at = Some(t),
            Expiry::Never | Expiry::Past => {
                self.flush_at = None;
                self.clear();
            }
        }
    }

    /// Inserts `key:0` .. `key:{count-1}`, each holding
    /// [`preload_value`]`(i, value_size)` with flags 0 and no expiry.
    pub fn preload(&mut self, count: usize, value_size: usize) {
        self.map.reserve(count);
        for i in 0..count {
            let key = format!("key:{i}");
            self.set(key.as_bytes(), 0, 0, &preload_value(i, value_size));
        }
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some((k, item)) = self.map.remove_entry(key) {
            self.bytes -= k.len() + item.data.len();
        }
    }

    fn clear(&mut self) {
        self.map.clear();
        self.bytes = 0;
    }

    fn expiry(&self, exptime: i32) -> Expiry {
        let exptime = i64::from(exptime);
        let secs = if exptime == 0 {
            return Expiry::Never;
        } else if exptime < 0 {
            return Expiry::Past;
        } else if exptime > REALTIME_MAXDELTA {
            let unix_now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            match u64::try_from(exptime)
                .ok()
                .and_then(|t| t.checked_sub(unix_now))
            {
                Some(secs) if secs > 0 => secs,
                _ => return Expiry::Past,
            }
        } else {
            exptime.unsigned_abs()
        };
        match self.now.checked_add(Duration::from_secs(secs)) {
            Some(t) => Expiry::At(t),
            None => Expiry::Never,
        }
    }
}

/// The deterministic value preloaded under `key:{index}`: `size` bytes where
/// byte `j` is `b'a' + (index + j) % 26`. Clients can recompute it to verify
/// a hit without having stored anything.
pub fn preload_value(index: usize, size: usize) -> Vec<u8> {
    (0..size)
        .map(|j| b'a' + (index.wrapping_add(j) % 26) as u8)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit<'a>(store: &'a Store, key: &[u8]) -> &'a Item {
        match store.get(key) {
            Lookup::Hit(item) => item,
            other => panic!("expected hit for {key:?}, got {other:?}"),
        }
    }

    #[test]
    fn set_get_delete() {
        let mut s = Store::new();
        assert_eq!(s.get(b"a"), Lookup::Miss);
        s.set(b"a", 5, 0, b"hello");
        assert_eq!(hit(&s, b"a").data, b"hello");
        assert_eq!(hit(&s, b"a").flags, 5);
        assert_eq!((s.len(), s.bytes()), (1, 6));
        s.set(b"a", 6, 0, b"hi");
        assert_eq!(hit(&s, b"a").data, b"hi");
        assert_eq!(hit(&s, b"a").flags, 6);
        assert_eq!((s.len(), s.bytes()), (1, 3));
        assert!(s.delete(b"a"));
        assert!(!s.delete(b"a"));
        assert_eq!((s.len(), s.bytes()), (0, 0));
    }

    #[test]
    fn overwrite_with_much_smaller_value_releases_memory() {
        let mut s = Store::new();
        s.set(b"k", 0, 0, &vec![1; 100_000]);
        s.set(b"k", 0, 0, b"x");
        assert!(hit(&s, b"k").data.capacity() < 1000);
        assert_eq!(s.bytes(), 2);
    }

    #[test]
    fn relative_expiry() {
        let mut s = Store::new();
        let t0 = Instant::now();
        s.set_now(t0);
        s.set(b"k", 0, 10, b"v");
        s.set_now(t0 + Duration::from_secs(9));
        assert_eq!(hit(&s, b"k").data, b"v");
        s.set_now(t0 + Duration::from_secs(10));
        assert_eq!(s.get(b"k"), Lookup::Expired);
        assert!(!s.delete(b"k"), "expired items are not DELETED");
        s.set(b"k", 0, 10, b"v");
        s.set_now(t0 + Duration::from_secs(30));
        assert_eq!(s.get(b"k"), Lookup::Expired);
        s.remove_expired(b"k");
        assert_eq!(s.get(b"k"), Lookup::Miss);
        assert_eq!((s.len(), s.bytes()), (0, 0));
    }

    #[test]
    fn negative_and_absolute_expiry() {
        let mut s = Store::new();
        s.set(b"k", 0, 0, b"old");
        s.set(b"k", 0, -1, b"new");
        assert_eq!(s.get(b"k"), Lookup::Miss);
        // An absolute time in the past (but beyond 30 days) is already expired.
        s.set(b"k", 0, REALTIME_MAXDELTA as i32 + 1, b"v");
        assert_eq!(s.get(b"k"), Lookup::Miss);
        // One far in the future is live.
        s.set(b"k", 0, i32::MAX, b"v");
        assert_eq!(hit(&s, b"k").data, b"v");
    }

    #[test]
    fn flush_now_and_delayed() {
        let mut s = Store::new();
        let t0 = Instant::now();
        s.set_now(t0);
        s.preload(10, 4);
        assert_eq!(s.len(), 10);
        s.flush(0);
        assert_eq!((s.len(), s.bytes()), (0, 0));
        s.set(b"a", 0, 0, b"1");
        s.flush(5);
        s.set(b"b", 0, 0, b"2");
        s.set_now(t0 + Duration::from_secs(4));
        assert_eq!(s.len(), 2);
        s.set_now(t0 + Duration::from_secs(5));
        assert_eq!(s.len(), 0);
        s.set(b"c", 0, 0, b"3");
        s.set_now(t0 + Duration::from_secs(100));
        assert_eq!(s.len(), 1, "a delayed flush fires once");
    }

    #[test]
    fn preload_is_deterministic() {
        let mut s = Store::new();
        s.preload(3, 30);
        assert_eq!(hit(&s, b"key:2").data, preload_value(2, 30));
        assert_eq!(&preload_value(1, 5), b"bcdef");
        assert_eq!(&preload_value(25, 3), b"zab");
        assert_eq!(preload_value(7, 0), b"");
        assert_eq!(s.get(b"key:3"), Lookup::Miss);
        assert_eq!(s.bytes(), 3 * 5 + 3 * 30);
    }
}
