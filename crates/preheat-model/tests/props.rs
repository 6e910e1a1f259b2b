//! Property tests of the data model: the file format round-trips, the k-of-n filter and the
//! run-length encoding (with gap merge) keep exactly the lines they promise, and the decoder
//! rejects any corruption without panicking.

use preheat_model::*;
use proptest::prelude::*;

fn arb_lines() -> impl Strategy<Value = LineSet> {
    prop::collection::vec((0u32..4, 0u64..5000), 0..400).prop_map(|v| {
        LineSet::from_lines(
            v.into_iter()
                .map(|(region, line)| RegionLine { region, line }),
        )
    })
}

fn arb_key() -> impl Strategy<Value = RegionKey> {
    prop_oneof![
        (
            "[a-z/]{1,20}",
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 0..20)
        )
            .prop_map(|(path, inode, build_id)| RegionKey::File(FileIdent {
                path,
                inode,
                build_id
            })),
        (0u8..5, "[a-z]{0,8}", any::<u32>()).prop_map(|(k, label, order)| RegionKey::Anon {
            kind: [
                AnonKind::Heap,
                AnonKind::Stack,
                AnonKind::Bss,
                AnonKind::Named,
                AnonKind::Anon
            ][k as usize],
            label,
            order
        }),
    ]
}

fn arb_profile() -> impl Strategy<Value = Profile> {
    (
        prop::collection::vec(arb_key(), 4..6),
        prop::collection::vec((any::<u16>(), 1u32..16, arb_lines(), 0u32..8), 0..4),
        1u32..9,
        any::<u64>(),
    )
        .prop_map(|(regions, classes, n, created)| {
            let mut seen = std::collections::BTreeSet::new();
            Profile {
                binary: BinaryIdent {
                    exe: FileIdent {
                        path: "/usr/bin/x".into(),
                        inode: 3,
                        build_id: vec![1; 20],
                    },
                },
                backend: Backend::Probe,
                filter: FilterParams {
                    k: 1.max(n / 2),
                    n,
                    gap: 0,
                },
                created_unix_s: created,
                regions,
                classes: classes
                    .into_iter()
                    .filter(|c| seen.insert(c.0))
                    .map(|(port, samples, lines, gap)| RequestClass {
                        port,
                        samples,
                        ws: WorkingSet::from_lines(&lines, gap),
                    })
                    .collect(),
            }
        })
}

proptest! {
    #[test]
    fn file_roundtrip(p in arb_profile()) {
        let bytes = encode_profile(&p);
        prop_assert_eq!(decode_profile(&bytes), Ok(p));
    }

    #[test]
    fn any_single_byte_corruption_is_rejected(p in arb_profile(), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = encode_profile(&p);
        let i = pos.index(bytes.len());
        bytes[i] ^= 1 << bit;
        prop_assert!(decode_profile(&bytes).is_err());
    }

    #[test]
    fn truncation_is_rejected(p in arb_profile(), cut in any::<prop::sample::Index>()) {
        let bytes = encode_profile(&p);
        let n = cut.index(bytes.len());
        prop_assert!(decode_profile(&bytes[..n]).is_err());
    }

    #[test]
    fn decoder_never_panics_on_garbage(mut bytes in prop::collection::vec(any::<u8>(), 0..300), magic in any::<bool>()) {
        if magic && bytes.len() >= 8 {
            bytes[..8].copy_from_slice(&format::MAGIC);
        }
        let _ = decode_profile(&bytes);
    }

    #[test]
    fn exact_rle_is_lossless(lines in arb_lines()) {
        let ws = WorkingSet::from_lines(&lines, 0);
        prop_assert_eq!(ws.to_lines(), lines.clone());
        prop_assert_eq!(ws.line_count(), lines.len() as u64);
        // Runs are sorted, non-empty, and never adjacent (adjacent runs would have merged).
        for r in &ws.regions {
            for w in r.runs.windows(2) {
                prop_assert!(w[0].end() < w[1].start);
            }
            prop_assert!(r.runs.iter().all(|x| x.len > 0));
        }
    }

    #[test]
    fn gap_merge_covers_and_bounds(lines in arb_lines(), gap in 0u32..10) {
        let exact = WorkingSet::from_lines(&lines, 0);
        let merged = WorkingSet::from_lines(&lines, gap);
        let covered = merged.to_lines();
        // Every original line is still covered.
        prop_assert_eq!(covered.intersection_len(&lines), lines.len());
        // Never more runs than exact; runs separated by more than `gap` missing lines.
        prop_assert!(merged.stats().runs <= exact.stats().runs);
        for r in &merged.regions {
            for w in r.runs.windows(2) {
                prop_assert!(w[1].start - w[0].end() > gap as u64);
            }
        }
        // Extra lines only come from gaps of at most `gap` lines between exact runs.
        let extra = covered.len() - lines.len();
        prop_assert!(extra as u64 <= exact.stats().runs * gap as u64);
    }

    #[test]
    fn k_of_n_filter_matches_counting(samples in prop::collection::vec(arb_lines(), 1..8), k in 1usize..8) {
        let kept = filter_k_of_n(&samples, k);
        let union = filter_k_of_n(&samples, 1);
        for l in union.as_slice() {
            let count = samples.iter().filter(|s| s.contains(l)).count();
            prop_assert_eq!(kept.contains(l), count >= k);
        }
        prop_assert!(kept.as_slice().windows(2).all(|w| w[0] < w[1]));
    }
}
