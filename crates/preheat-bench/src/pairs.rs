//! What the paired benchmarks (`agent`, `observe`) gather over their pairs: per pair, two
//! servers on one CPU measured in alternating blocks, the first plain and the second with what
//! is measured; each pair gives one throughput loss (pooled and block-wise) and one p50 delta.

use preheat_model::stats::summarize;

/// The pairs' results so far.
#[derive(Default)]
pub(crate) struct Pairs {
    /// Every request's latency, µs: the plain server's and the other's.
    pub without: Vec<f64>,
    pub with: Vec<f64>,
    /// Per pair: 1 − throughput with / without, over all its blocks.
    pub loss: Vec<f64>,
    /// Per pair: 1 − the median of its blocks' time ratios.
    pub loss_blk: Vec<f64>,
    /// Per pair: p50 with − p50 without, µs.
    pub dp50: Vec<f64>,
}

impl Pairs {
    /// Add one pair: `secs[k]` the seconds of server k's blocks of `per_block` requests,
    /// `lat[k]` its requests' latencies.
    pub fn add(&mut self, per_block: usize, secs: &[Vec<f64>; 2], lat: [Vec<f64>; 2]) {
        let tput = |k: usize| (per_block * secs[k].len()) as f64 / secs[k].iter().sum::<f64>();
        self.loss.push(1.0 - tput(1) / tput(0));
        let ratios: Vec<f64> = secs[0].iter().zip(&secs[1]).map(|(wo, w)| wo / w).collect();
        self.loss_blk.push(1.0 - summarize(&ratios).p50);
        self.dp50
            .push(summarize(&lat[1]).p50 - summarize(&lat[0]).p50);
        let [l0, l1] = lat;
        self.without.extend(l0);
        self.with.extend(l1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_twice_as_slow_loses_half() {
        let mut p = Pairs::default();
        p.add(
            10,
            &[vec![1.0, 1.0], vec![2.0, 2.0]],
            [vec![5.0; 3], vec![7.0; 3]],
        );
        assert!((p.loss[0] - 0.5).abs() < 1e-12);
        assert!((p.loss_blk[0] - 0.5).abs() < 1e-12);
        assert!((p.dp50[0] - 2.0).abs() < 1e-12);
        assert_eq!((p.without.len(), p.with.len()), (3, 3));
    }
}
