//! Fuzz the announcement datagram decoder: never panics; accepted datagrams round-trip.
#![no_main]
use libfuzzer_sys::fuzz_target;
use preheat_model::proto::Announcement;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = Announcement::decode(data) {
        assert_eq!(&a.encode()[..], data);
    }
});
