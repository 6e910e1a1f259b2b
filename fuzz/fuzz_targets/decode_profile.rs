//! Fuzz the .phws decoder: it must never panic, and whatever it accepts must re-encode to the
//! same bytes (the format has exactly one encoding per profile).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = preheat_model::decode_profile(data) {
        assert_eq!(preheat_model::encode_profile(&p), data);
    }
});
