//! Wire format properties: round trips, corruption, fuzzing, and the admission gate.

use preheat_net::wire::{
    decode, encode, Allocation, Demand, Gate, Key, Msg, NetAnnouncement, WireError, HEADER_LEN,
    KIND_ANNOUNCE, MAC_LEN, ROLE_ARBITER, ROLE_SENDER,
};
use proptest::prelude::*;
use rand::{Rng, RngCore, SeedableRng};

fn key() -> Key {
    Key([0x5a; 32])
}

fn arb_msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        (any::<u32>(), any::<u16>(), 1..=u16::MAX, any::<u64>()).prop_map(
            |(dst, dst_port, packets, flow)| Msg::Demand(Demand {
                dst,
                dst_port,
                packets,
                flow
            })
        ),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u16>(),
            any::<u64>(),
            1..=u16::MAX,
            1..=u32::MAX
        )
            .prop_map(|(flow, dst, dst_port, send_at_ns, slots, slot_ns)| {
                Msg::Allocation(Allocation {
                    flow,
                    dst,
                    dst_port,
                    send_at_ns,
                    slots,
                    slot_ns,
                })
            }),
        (
            any::<u32>(),
            any::<u16>(),
            any::<u64>(),
            any::<u64>(),
            1..=u16::MAX
        )
            .prop_map(|(src, dst_port, arrival_ns, flow, packets)| Msg::Announce(
                NetAnnouncement {
                    src,
                    dst_port,
                    arrival_ns,
                    flow,
                    packets
                }
            )),
        (ROLE_SENDER..=ROLE_ARBITER).prop_map(|role| Msg::Hello { role }),
    ]
}

proptest! {
    #[test]
    fn round_trip(msg in arb_msg(), sender: u32, seq: u64, sent_ns: u64) {
        let b = encode(&key(), sender, seq, sent_ns, &msg);
        let (h, m) = decode(&key(), &b).unwrap();
        prop_assert_eq!(m, msg);
        prop_assert_eq!((h.version, h.kind, h.sender, h.seq, h.sent_ns),
                        (1, msg.kind(), sender, seq, sent_ns));
    }

    #[test]
    fn wrong_key_is_bad_mac(msg in arb_msg(), k: [u8; 32]) {
        prop_assume!(k != key().0);
        let b = encode(&Key(k), 1, 2, 3, &msg);
        prop_assert_eq!(decode(&key(), &b), Err(WireError::BadMac));
    }

    #[test]
    fn truncated_or_extended_is_rejected(msg in arb_msg(), cut in 0usize..80, extra in 1usize..8) {
        let b = encode(&key(), 1, 2, 3, &msg);
        let cut = cut.min(b.len() - 1);
        prop_assert!(decode(&key(), &b[..cut]).is_err());
        let mut longer = b.clone();
        longer.extend(vec![0u8; extra]);
        prop_assert_eq!(decode(&key(), &longer), Err(WireError::Length));
    }
}

fn one_of_each() -> Vec<Msg> {
    vec![
        Msg::Demand(Demand {
            dst: 0x7f00_0001,
            dst_port: 11211,
            packets: 2,
            flow: 99,
        }),
        Msg::Allocation(Allocation {
            flow: 99,
            dst: 0x7f00_0001,
            dst_port: 11211,
            send_at_ns: 123_456_789,
            slots: 2,
            slot_ns: 1231,
        }),
        Msg::Announce(NetAnnouncement {
            src: 0x7f00_0002,
            dst_port: 11211,
            arrival_ns: 123_456_789,
            flow: 99,
            packets: 2,
        }),
        Msg::Hello { role: ROLE_SENDER },
    ]
}

#[test]
fn every_single_bit_corruption_is_rejected() {
    for msg in one_of_each() {
        let b = encode(&key(), 0x7f00_0002, 42, 1_000, &msg);
        let mut header_errors = 0;
        for bit in 0..b.len() * 8 {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            match decode(&key(), &c) {
                Ok(x) => panic!("bit {bit} of {msg:?} flipped and still accepted: {x:?}"),
                Err(WireError::BadMac) => {}
                Err(
                    WireError::Malformed(_)
                    | WireError::Version(_)
                    | WireError::Kind(_)
                    | WireError::Length,
                ) => {
                    // Only the unauthenticated framing (magic, version, kind, length) may be
                    // refused before the MAC is checked.
                    assert!(bit < 64, "bit {bit} refused before the MAC");
                    header_errors += 1;
                }
                Err(WireError::Short) => panic!("length unchanged, cannot be short"),
            }
        }
        assert!(header_errors > 0);
    }
}

#[test]
fn framing_errors_are_classified() {
    let b = encode(&key(), 1, 2, 3, &Msg::Hello { role: ROLE_ARBITER });
    assert_eq!(
        decode(&key(), &b[..HEADER_LEN + MAC_LEN - 1]),
        Err(WireError::Short)
    );
    let mut v = b.clone();
    v[4] = 2;
    assert_eq!(decode(&key(), &v), Err(WireError::Version(2)));
    let mut k = b.clone();
    k[5] = 9;
    assert_eq!(decode(&key(), &k), Err(WireError::Kind(9)));
    let mut m = b.clone();
    m[0] = b'X';
    assert!(matches!(decode(&key(), &m), Err(WireError::Malformed(_))));
    // Body rules are checked after the MAC, on authenticated data.
    let zero = encode(&key(), 1, 2, 3, &Msg::Hello { role: 0 });
    assert!(matches!(
        decode(&key(), &zero),
        Err(WireError::Malformed(_))
    ));
    let zero = encode(
        &key(),
        1,
        2,
        3,
        &Msg::Demand(Demand {
            dst: 1,
            dst_port: 1,
            packets: 0,
            flow: 1,
        }),
    );
    assert!(matches!(
        decode(&key(), &zero),
        Err(WireError::Malformed(_))
    ));
    for e in [
        WireError::Short,
        WireError::Version(3),
        WireError::Kind(7),
        WireError::Length,
        WireError::BadMac,
        WireError::Malformed("x"),
    ] {
        assert!(!e.to_string().is_empty());
    }
}

#[test]
fn fuzz_random_bytes_never_panic() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x9e37_79b9);
    let valid: Vec<Vec<u8>> = one_of_each()
        .iter()
        .map(|m| encode(&key(), 7, 8, 9, m))
        .collect();
    let mut gate = Gate::new(key(), 1e6, 1e6, u64::MAX);
    for i in 0..10_000 {
        let bytes = if i % 2 == 0 {
            // Uniform garbage of any length up to 128.
            let len = rng.gen_range(0..128);
            let mut b = vec![0u8; len];
            rng.fill_bytes(&mut b);
            b
        } else {
            // A valid frame with random bytes overwritten: exercises the paths past framing.
            let mut b = valid[rng.gen_range(0..valid.len())].clone();
            for _ in 0..rng.gen_range(1..4) {
                let j = rng.gen_range(0..b.len());
                b[j] = rng.gen();
            }
            b
        };
        let r = decode(&key(), &bytes);
        if let Ok((_, m)) = r {
            // Only an unchanged valid frame can decode.
            assert!(valid.contains(&bytes), "random bytes decoded to {m:?}");
        }
        let _ = gate.admit(&bytes, 0);
    }
    let c = gate.counters();
    assert_eq!(c.received, 10_000);
    assert_eq!(c.received, c.accepted + c.dropped());
}

#[test]
fn gate_drops_and_counts_spoofed_replayed_stale_and_flooded() {
    let max_age = 1_000_000;
    let mut g = Gate::new(key(), 1000.0, 3.0, max_age).accept_only(&[KIND_ANNOUNCE]);
    let ann = |flow| {
        Msg::Announce(NetAnnouncement {
            src: 1,
            dst_port: 80,
            arrival_ns: 5,
            flow,
            packets: 1,
        })
    };
    let now = 10_000_000_000u64;
    let ok = encode(&key(), 9, 100, now, &ann(1));
    assert!(g.admit(&ok, now).is_some());
    // Replay of the same datagram.
    assert!(g.admit(&ok, now + 1).is_none());
    assert_eq!(g.counters().replayed, 1);
    // Wrong key.
    let spoof = encode(&Key([1; 32]), 9, 101, now, &ann(2));
    assert!(g.admit(&spoof, now).is_none());
    assert_eq!(g.counters().bad_mac, 1);
    // Stale: too old, and too far in the future.
    let old = encode(&key(), 9, 102, now - max_age - 1, &ann(3));
    let future = encode(&key(), 9, 103, now + max_age + 1, &ann(4));
    assert!(g.admit(&old, now).is_none());
    assert!(g.admit(&future, now).is_none());
    assert_eq!(g.counters().stale, 2);
    // A stale datagram did not consume its sequence number: re-sent fresh, it is accepted.
    let refreshed = encode(&key(), 9, 102, now, &ann(3));
    assert!(g.admit(&refreshed, now).is_some());
    // Too old for the replay window.
    let ancient_seq = encode(&key(), 9, 102 - 64, now, &ann(5));
    assert!(g.admit(&ancient_seq, now).is_none());
    assert_eq!(g.counters().replayed, 2);
    // A kind this endpoint does not accept.
    let demand = encode(
        &key(),
        9,
        110,
        now,
        &Msg::Demand(Demand {
            dst: 1,
            dst_port: 80,
            packets: 1,
            flow: 6,
        }),
    );
    assert!(g.admit(&demand, now).is_none());
    assert_eq!(g.counters().malformed, 1);
    // Rate: burst of 3, two used already; then one per ms.
    let seqs = 200..210u64;
    let admitted = seqs
        .clone()
        .filter(|&s| g.admit(&encode(&key(), 9, s, now, &ann(s)), now).is_some())
        .count();
    assert_eq!(admitted, 1);
    assert_eq!(g.counters().rate_limited, 9);
    assert!(g
        .admit(
            &encode(&key(), 9, 300, now + 1_000_000, &ann(300)),
            now + 1_000_000
        )
        .is_some());
    // Another sender has its own bucket and window.
    assert!(g
        .admit(&encode(&key(), 10, 100, now, &ann(7)), now)
        .is_some());
    let c = *g.counters();
    assert_eq!(c.received, c.accepted + c.dropped());
    assert_eq!(c.accepted, 5);
}
