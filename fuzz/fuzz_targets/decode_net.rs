//! Fuzz the network protocol decoder with a fixed key: never panics; an accepted datagram
//! re-encodes to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use preheat_net::wire::{decode, encode, Key};

fuzz_target!(|data: &[u8]| {
    let key = Key([7u8; 32]);
    if let Ok((h, m)) = decode(&key, data) {
        assert_eq!(encode(&key, h.sender, h.seq, h.sent_ns, &m), data);
    }
});
