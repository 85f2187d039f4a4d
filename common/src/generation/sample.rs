//! Picking the next token from a row's logits, on the stage that makes
//! them: greedy (temperature 0) or drawn with temperature, top-k and top-p.
//! A draw depends only on the row's seed and the token's index in its
//! generation, so the same seed gives the same text and a step replayed
//! after a worker loss draws the same token; with log-probabilities when
//! they are asked for.

use crate::tensor::Tensor;
use crate::wire::data::{SampledToken, Sampling};

/// SplitMix64: small, fast and good enough to draw tokens with.
struct SplitMix64(u64);

impl SplitMix64 {
    /// The generator of draw `index` of seed `seed`.
    fn at(seed: u64, index: u32) -> SplitMix64 {
        let mut mixer = SplitMix64(seed ^ u64::from(index).wrapping_mul(0xD1B5_4A32_D192_ED03));
        SplitMix64(mixer.next_u64())
    }

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

/// The next token of a row with `logits` (`None` for empty or all-NaN
/// logits).
pub fn draw(logits: &[f32], how: &Sampling) -> Option<SampledToken> {
    let token = if how.temperature == 0.0 {
        argmax(logits)?
    } else {
        sample(logits, how)?
    };
    if how.logprobs == 0 {
        return Some(SampledToken {
            id: token,
            logprob: None,
            top: Vec::new(),
        });
    }
    let logprobs = log_softmax(logits);
    let mut top: Vec<(u32, f32)> = logprobs
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan())
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let n = (how.logprobs as usize).min(top.len());
    let by_logprob = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if n > 0 && n < top.len() {
        top.select_nth_unstable_by(n - 1, by_logprob);
    }
    top.truncate(n);
    top.sort_unstable_by(by_logprob);
    Some(SampledToken {
        id: token,
        logprob: logprobs.get(token as usize).copied(),
        top,
    })
}

/// Each row's logits at its last position, of a step's `logits` output
/// (`[rows, positions, vocab]` or `[rows, vocab]`, float or float16): a
/// prompt's step makes a row of logits per token, and only the last is
/// drawn from.
pub fn last_logits(logits: &Tensor, rows: usize) -> Result<Vec<Vec<f32>>, String> {
    let shape = logits.shape();
    let bad = || format!("logits of shape {shape:?} for {rows} rows");
    let vocab = *shape.last().ok_or_else(bad)?;
    let element = logits
        .elem()
        .size_bytes()
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| format!("logits of type {}", logits.elem()))?;
    let bytes = logits.shared_bytes();
    let per_row = bytes.len() / rows.max(1);
    let last = element * vocab;
    if rows == 0 || last == 0 || last > per_row || per_row * rows != bytes.len() {
        return Err(bad());
    }
    (1..=rows)
        .map(|r| {
            let end = r * per_row;
            let row = Tensor::new(logits.elem(), vec![vocab], bytes.slice(end - last..end))
                .map_err(|e| e.to_string())?;
            row.float_values()
                .ok_or_else(|| format!("logits of type {}", logits.elem()))
        })
        .collect()
}

/// A draw at the row's temperature among its top-k and top-p.
fn sample(logits: &[f32], how: &Sampling) -> Option<u32> {
    let mut candidates: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan())
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1);
    let top_k = how.top_k as usize;
    if top_k > 0 && top_k < candidates.len() {
        candidates.select_nth_unstable_by(top_k - 1, by_logit);
        candidates.truncate(top_k);
    }
    candidates.sort_unstable_by(by_logit);
    let top = candidates.first()?.1;
    let t = f64::from(how.temperature);
    let mut weights: Vec<f64> = candidates
        .iter()
        .map(|(_, l)| ((f64::from(*l) - f64::from(top)) / t).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    if how.top_p < 1.0 {
        let mut kept = 0.0;
        let cut = weights
            .iter()
            .position(|w| {
                kept += w / total;
                kept >= f64::from(how.top_p)
            })
            .map_or(weights.len(), |i| i + 1);
        weights.truncate(cut);
    }
    let total: f64 = weights.iter().sum();
    let mut u = SplitMix64::at(how.seed, how.index).next_f64() * total;
    for (w, (id, _)) in weights.iter().zip(&candidates) {
        if u < *w {
            return Some(*id);
        }
        u -= w;
    }
    candidates.get(weights.len().saturating_sub(1)).map(|c| c.0)
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

/// `log(softmax(logits))`, in f64 for the sum.
fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let top = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| f64::from(l - top).exp())
        .sum();
    let log_sum = sum.ln() as f32;
    logits.iter().map(|&l| l - top - log_sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn how(temperature: f32, top_k: u32, top_p: f32, seed: u64, index: u32) -> Sampling {
        Sampling {
            temperature,
            top_k,
            top_p,
            seed,
            index,
            logprobs: 0,
        }
    }

    fn token(logits: &[f32], s: &Sampling) -> Option<u32> {
        draw(logits, s).map(|d| d.id)
    }

    #[test]
    fn greedy_takes_the_first_largest_and_skips_nan() {
        let s = how(0.0, 0, 1.0, 0, 0);
        assert_eq!(token(&[0.1, f32::NAN, 3.0, 3.0, -1.0], &s), Some(2));
        assert_eq!(token(&[], &s), None);
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_keeps_the_head() {
        let logits = [1.0, 5.0, 2.0, 4.9];
        for index in 0..50 {
            assert_eq!(token(&logits, &how(1.0, 1, 1.0, 3, index)), Some(1));
            assert_eq!(token(&logits, &how(1.0, 0, 0.01, 3, index)), Some(1));
        }
    }

    #[test]
    fn sampling_follows_the_distribution_and_depends_on_seed_and_index_only() {
        // Probabilities 0.5, 0.25, 0.25 at temperature 1.
        let logits = [2f32.ln(), 0.0, 0.0];
        let draws: Vec<u32> = (0..4000)
            .filter_map(|i| token(&logits, &how(1.0, 0, 1.0, 42, i)))
            .collect();
        let mut counts = [0u32; 3];
        for &d in &draws {
            counts[d as usize] += 1;
        }
        // 4000 draws: the standard deviation of the first count is ~32.
        assert!((1850..2150).contains(&counts[0]), "{counts:?}");
        assert!((850..1150).contains(&counts[1]), "{counts:?}");
        // The same seed and index, the same draw, in any order.
        let replay: Vec<u32> = (0..4000)
            .rev()
            .filter_map(|i| token(&logits, &how(1.0, 0, 1.0, 42, i)))
            .collect();
        assert_eq!(draws, replay.into_iter().rev().collect::<Vec<_>>());
        let other: Vec<u32> = (0..4000)
            .filter_map(|i| token(&logits, &how(1.0, 0, 1.0, 43, i)))
            .collect();
        assert_ne!(draws, other, "another seed draws otherwise");
    }

    #[test]
    fn the_last_position_of_each_row() {
        // 2 rows × 3 positions × 2 tokens.
        let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let logits = Tensor::from_values(vec![2, 3, 2], &values).unwrap();
        assert_eq!(
            last_logits(&logits, 2).unwrap(),
            vec![vec![4.0, 5.0], vec![10.0, 11.0]]
        );
        assert!(last_logits(&logits, 5).is_err());
    }

    #[test]
    fn log_probabilities_of_the_drawn_and_the_most_likely() {
        let logits = [2f32.ln(), 0.0, 0.0, f32::NAN];
        let mut s = how(0.0, 0, 1.0, 0, 0);
        s.logprobs = 2;
        let d = draw(&logits, &s).unwrap();
        assert_eq!(d.id, 0);
        assert!((d.logprob.unwrap() - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(d.top.len(), 2);
        assert_eq!(d.top[0].0, 0);
        assert_eq!(d.top[1].0, 1, "the first of equals");
        assert!((d.top[1].1 - 0.25f32.ln()).abs() < 1e-6);
    }
}
