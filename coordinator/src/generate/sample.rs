//! Picking the next token from a step's logits: greedy (temperature 0) or
//! sampled with temperature, top-k and top-p, from a seeded generator so
//! that the same seed gives the same text.

use tessera_common::wire::generate::GenerateParams;

/// SplitMix64: small, fast and good enough to draw tokens with.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub struct Sampler {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    rng: SplitMix64,
}

impl Sampler {
    pub fn new(params: &GenerateParams) -> Sampler {
        Sampler {
            temperature: params.temperature,
            top_k: params.top_k as usize,
            top_p: params.top_p,
            rng: SplitMix64(params.seed),
        }
    }

    /// The next token (`None` for empty logits).
    pub fn pick(&mut self, logits: &[f32]) -> Option<u32> {
        if self.temperature == 0.0 {
            return argmax(logits);
        }
        let mut candidates: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1);
        if self.top_k > 0 && self.top_k < candidates.len() {
            candidates.select_nth_unstable_by(self.top_k - 1, by_logit);
            candidates.truncate(self.top_k);
        }
        candidates.sort_unstable_by(by_logit);
        let top = candidates.first()?.1;
        let t = f64::from(self.temperature);
        let mut weights: Vec<f64> = candidates
            .iter()
            .map(|(_, l)| ((f64::from(*l) - f64::from(top)) / t).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        if self.top_p < 1.0 {
            let mut kept = 0.0;
            let cut = weights
                .iter()
                .position(|w| {
                    kept += w / total;
                    kept >= f64::from(self.top_p)
                })
                .map_or(weights.len(), |i| i + 1);
            weights.truncate(cut);
        }
        let total: f64 = weights.iter().sum();
        let mut u = self.rng.next_f64() * total;
        for (w, (id, _)) in weights.iter().zip(&candidates) {
            if u < *w {
                return Some(*id);
            }
            u -= w;
        }
        candidates.get(weights.len().saturating_sub(1)).map(|c| c.0)
    }
}

/// The index of the largest value (the first of equals; NaN never wins).
fn argmax(values: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in values.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: u32, top_p: f32, seed: u64) -> GenerateParams {
        GenerateParams {
            temperature,
            top_k,
            top_p,
            seed,
            ..GenerateParams::default()
        }
    }

    #[test]
    fn greedy_takes_the_first_largest_and_skips_nan() {
        let mut s = Sampler::new(&params(0.0, 0, 1.0, 0));
        assert_eq!(s.pick(&[0.1, f32::NAN, 3.0, 3.0, -1.0]), Some(2));
        assert_eq!(s.pick(&[]), None);
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_keeps_the_head() {
        let logits = [1.0, 5.0, 2.0, 4.9];
        let mut k1 = Sampler::new(&params(1.0, 1, 1.0, 3));
        let mut tiny_p = Sampler::new(&params(1.0, 0, 0.01, 3));
        for _ in 0..50 {
            assert_eq!(k1.pick(&logits), Some(1));
            assert_eq!(tiny_p.pick(&logits), Some(1));
        }
    }

    #[test]
    fn sampling_follows_the_distribution_and_the_seed() {
        // Probabilities 0.5, 0.25, 0.25 at temperature 1.
        let logits = [2f32.ln(), 0.0, 0.0];
        let mut s = Sampler::new(&params(1.0, 0, 1.0, 42));
        let mut counts = [0u32; 3];
        let draws: Vec<u32> = (0..4000).filter_map(|_| s.pick(&logits)).collect();
        for &d in &draws {
            counts[d as usize] += 1;
        }
        // 4000 draws: the standard deviation of the first count is ~32.
        assert!((1850..2150).contains(&counts[0]), "{counts:?}");
        assert!((850..1150).contains(&counts[1]), "{counts:?}");
        let mut again = Sampler::new(&params(1.0, 0, 1.0, 42));
        let replay: Vec<u32> = (0..4000).filter_map(|_| again.pick(&logits)).collect();
        assert_eq!(draws, replay);
    }
}
