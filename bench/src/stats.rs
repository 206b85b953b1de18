//! Medians and spread of repeated measurements.

/// Median, minimum and maximum of a set of repetitions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Self {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        }
    }

    /// `median [min–max]` with `digits` decimals.
    pub fn show(&self, digits: usize) -> String {
        if self.n <= 1 {
            format!("{:.digits$}", self.median)
        } else {
            format!(
                "{:.digits$} [{:.digits$}–{:.digits$}]",
                self.median, self.min, self.max
            )
        }
    }
}

/// The value at quantile `q` (0..=1) of unsorted samples.
pub fn quantile(samples: &[f64], q: f64) -> f64 {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let idx = ((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
    v[idx.min(v.len() - 1)]
}
