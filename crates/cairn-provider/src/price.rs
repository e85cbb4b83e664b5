//! What a model's tokens cost, as the user states it in `[providers.NAME]`
//! (`input_per_mtok`, `output_per_mtok`, `cached_input_per_mtok`: US
//! dollars per million tokens), and the arithmetic of a cost.
//!
//! This module owns the price record, the checks a written price must pass
//! (a clear error naming the key, never a silent absurd figure) and the
//! sums, done in integers so a session's cost is exact and tables stay
//! `Eq`. It must not hold a price table of its own: prices change without
//! notice and a stale figure shown as a cost is worse than "unknown", so a
//! remote provider is priced only by what the user wrote. It must not read
//! config files or the ledger (the host does).

use std::fmt;

use serde::Deserialize;

/// US dollars per million tokens, as written in the config file
/// (`input_per_mtok = 1.25`; an integer is read as well). Compared bit for
/// bit, so a table holding one stays `Eq`; a written value is checked by
/// [`Prices::from_written`] before anything is priced with it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(transparent)]
pub struct UsdPerMtok(pub f64);

impl PartialEq for UsdPerMtok {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for UsdPerMtok {}

/// The highest price accepted, in US dollars per million tokens: two orders
/// above the dearest models sold today, so only a slip (a price per
/// thousand tokens times a thousand, a stray digit) is refused.
pub const MAX_USD_PER_MTOK: f64 = 10_000.0;

/// The lowest price other than zero accepted, in US dollars per million
/// tokens: a smaller figure is almost surely a price per token written
/// where a price per million belongs ($3 per million is 0.000003 per token).
pub const MIN_USD_PER_MTOK: f64 = 0.001;

/// The prices of one model, in micro-dollars per million tokens (so $1.25
/// per million is 1,250,000): integers, exact in sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prices {
    /// Input tokens that were not read from the provider's cache.
    pub input: u64,
    /// Input tokens read from the provider's cache.
    pub cached_input: u64,
    /// Output tokens (reasoning included, as the APIs count them).
    pub output: u64,
}

impl Prices {
    /// What the embedded model and a script cost: nothing.
    pub const FREE: Prices = Prices { input: 0, cached_input: 0, output: 0 };

    /// The prices as written in the table of provider `name`: input and
    /// output together or neither (`None`); cached input defaults to the
    /// input price (an upper bound: providers charge less for it). Each
    /// value is checked; the error names the key and what to write.
    pub fn from_written(
        input: Option<UsdPerMtok>,
        output: Option<UsdPerMtok>,
        cached_input: Option<UsdPerMtok>,
    ) -> Result<Option<Prices>, String> {
        match (input, output) {
            (None, None) => match cached_input {
                None => Ok(None),
                Some(_) => Err("`cached_input_per_mtok` needs `input_per_mtok` and `output_per_mtok` too".to_owned()),
            },
            (Some(_), None) => {
                Err("`input_per_mtok` is set but `output_per_mtok` is not: set both (US dollars per million tokens)"
                    .to_owned())
            }
            (None, Some(_)) => {
                Err("`output_per_mtok` is set but `input_per_mtok` is not: set both (US dollars per million tokens)"
                    .to_owned())
            }
            (Some(input), Some(output)) => {
                let input = micro_per_mtok("input_per_mtok", input)?;
                let output = micro_per_mtok("output_per_mtok", output)?;
                let cached_input = match cached_input {
                    Some(cached) => micro_per_mtok("cached_input_per_mtok", cached)?,
                    None => input,
                };
                Ok(Some(Prices { input, cached_input, output }))
            }
        }
    }

    /// The cost of one provider attempt: `input` tokens of which `cached`
    /// were read from the cache (cairn's usage rows count cached tokens
    /// inside the input, for every API), and `output` tokens.
    pub fn cost(&self, input: u64, cached: u64, output: u64) -> Usd {
        let cached = cached.min(input);
        let pico = u128::from(input - cached) * u128::from(self.input)
            + u128::from(cached) * u128::from(self.cached_input)
            + u128::from(output) * u128::from(self.output);
        Usd { pico }
    }
}

/// `value` of `key` in micro-dollars per million tokens, or why it is not a
/// price.
fn micro_per_mtok(key: &str, value: UsdPerMtok) -> Result<u64, String> {
    let v = value.0;
    let what = "give US dollars per million tokens, e.g. 3 for $3 per million";
    if !v.is_finite() || v < 0.0 {
        return Err(format!("`{key}` = {v} is not a price: {what}"));
    }
    if v > MAX_USD_PER_MTOK {
        return Err(format!(
            "`{key}` = {v} is more than {MAX_USD_PER_MTOK} US dollars per million tokens, which no model costs: {what}"
        ));
    }
    if v != 0.0 && v < MIN_USD_PER_MTOK {
        return Err(format!(
            "`{key}` = {v} is below {MIN_USD_PER_MTOK} US dollars per million tokens; is it a price per token? {what}"
        ));
    }
    // Finite, not negative and bounded above, so the cast is exact to the
    // micro-dollar.
    Ok((v * 1e6).round() as u64)
}

/// An amount of US dollars, held in picodollars (10⁻¹² USD: a token times a
/// price in micro-dollars per million tokens), so sums are exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Usd {
    /// Picodollars.
    pub pico: u128,
}

impl std::ops::AddAssign for Usd {
    fn add_assign(&mut self, other: Usd) {
        self.pico = self.pico.saturating_add(other.pico);
    }
}

/// Picodollars in a cent hundredth (the 4-decimal unit), and in a cent.
const PICO_PER_TEN_THOUSANDTH: u128 = 100_000_000;
const PICO_PER_CENT: u128 = 10_000_000_000;

impl fmt::Display for Usd {
    /// `$0`; `<$0.0001`; four decimals under a dollar (`$0.0122`); cents
    /// from a dollar up (`$12.35`); each rounded half up.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pico == 0 {
            return f.write_str("$0");
        }
        let ten_thousandths = (self.pico + PICO_PER_TEN_THOUSANDTH / 2) / PICO_PER_TEN_THOUSANDTH;
        if ten_thousandths == 0 {
            return f.write_str("<$0.0001");
        }
        if ten_thousandths < 10_000 {
            return write!(f, "${}.{:04}", ten_thousandths / 10_000, ten_thousandths % 10_000);
        }
        let cents = (self.pico + PICO_PER_CENT / 2) / PICO_PER_CENT;
        write!(f, "${}.{:02}", cents / 100, cents % 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usd(v: f64) -> Option<UsdPerMtok> {
        Some(UsdPerMtok(v))
    }

    #[test]
    fn written_prices_become_micro_dollars() {
        let p = Prices::from_written(usd(1.25), usd(10.0), usd(0.125)).unwrap().unwrap();
        assert_eq!(p, Prices { input: 1_250_000, cached_input: 125_000, output: 10_000_000 });
        let p = Prices::from_written(usd(3.0), usd(15.0), None).unwrap().unwrap();
        assert_eq!(p.cached_input, 3_000_000, "cached input defaults to the input price");
        assert_eq!(Prices::from_written(usd(0.0), usd(0.0), None).unwrap(), Some(Prices::FREE));
        assert_eq!(Prices::from_written(None, None, None).unwrap(), None);
    }

    #[test]
    fn a_bad_price_is_refused_naming_its_key() {
        for (input, output, cached, key, says) in [
            (-1.0, 1.0, None, "input_per_mtok", "is not a price"),
            (1.0, f64::NAN, None, "output_per_mtok", "is not a price"),
            (f64::INFINITY, 1.0, None, "input_per_mtok", "is not a price"),
            (1.0, 20_000.0, None, "output_per_mtok", "more than 10000"),
            (0.000_003, 1.0, None, "input_per_mtok", "price per token"),
            (1.0, 2.0, Some(-0.5), "cached_input_per_mtok", "is not a price"),
        ] {
            let err = Prices::from_written(usd(input), usd(output), cached.map(UsdPerMtok)).unwrap_err();
            assert!(err.contains(&format!("`{key}`")) && err.contains(says), "{err}");
        }
        let err = Prices::from_written(usd(1.0), None, None).unwrap_err();
        assert!(err.contains("`output_per_mtok` is not"), "{err}");
        let err = Prices::from_written(None, usd(1.0), None).unwrap_err();
        assert!(err.contains("`input_per_mtok` is not"), "{err}");
        let err = Prices::from_written(None, None, usd(1.0)).unwrap_err();
        assert!(err.contains("cached_input_per_mtok"), "{err}");
    }

    #[test]
    fn costs_are_exact_and_read_as_dollars() {
        // $3 in, $0.30 cached, $15 out per million: 1,234 input tokens of
        // which 200 cached, 567 output. By hand: 1,034 × 3 = 3,102 µ$;
        // 200 × 0.3 = 60 µ$; 567 × 15 = 8,505 µ$; 11,667 µ$ = $0.011667.
        let p = Prices { input: 3_000_000, cached_input: 300_000, output: 15_000_000 };
        let cost = p.cost(1_234, 200, 567);
        assert_eq!(cost.pico, 11_667_000_000);
        assert_eq!(cost.to_string(), "$0.0117");
        assert_eq!(Prices::FREE.cost(1_000_000, 0, 1_000_000).to_string(), "$0");
        // 10 tokens at $0.15 per million: $0.0000015.
        let tiny = Prices { input: 150_000, cached_input: 150_000, output: 0 }.cost(10, 0, 0);
        assert_eq!(tiny.to_string(), "<$0.0001");
        // 2 million output tokens at $6.175 per million: $12.35.
        let big = Prices { input: 0, cached_input: 0, output: 6_175_000 }.cost(0, 0, 2_000_000);
        assert_eq!(big.to_string(), "$12.35");
        // Rounded half up: $0.00005 shows as $0.0001; $0.99995 as $1.00.
        assert_eq!(Usd { pico: 50_000_000 }.to_string(), "$0.0001");
        assert_eq!(Usd { pico: 999_950_000_000 }.to_string(), "$1.00");
        let mut sum = Usd::default();
        sum += cost;
        sum += big;
        assert_eq!(sum.pico, 11_667_000_000 + 12_350_000_000_000);
    }
}
