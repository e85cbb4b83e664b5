//! Number literals under range keywords: the syntax of a number prefix and,
//! for `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`, whether a
//! prefix can still end as a value that core's schema check accepts.
//!
//! Core compares the `f64` that `serde_json` parses against each bound. A
//! bounded number here is `-?(0|[1-9][0-9]*)(\.[0-9]+)?` with at most
//! [`MAX_BOUNDED_DIGITS`] digits and no exponent, so its significand is below
//! 2^53 and its power of ten at most 15: `serde_json` parses it with one
//! correctly rounded division, which [`Prefix::value`] repeats exactly.
//! Correct rounding is monotonic, so the values reachable from a prefix lie
//! between the values of its smallest and largest completion; a search down
//! the (at most two) branches that straddle a bound decides the rest.
//!
//! This module must not know about frames or tokens; it sees digits.

use serde_json::{Map, Value};

/// Most digits (integer and fraction together) of a bounded number.
pub(crate) const MAX_BOUNDED_DIGITS: u8 = 15;

/// Exact powers of ten as `f64` (every one up to 1e22 is exact).
const POW10: [f64; 16] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15];

/// Where a number literal stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NumPh {
    Start,
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

impl NumPh {
    /// Whether a literal may end in this phase.
    pub(crate) fn can_end(self) -> bool {
        matches!(self, NumPh::Zero | NumPh::Int | NumPh::Frac | NumPh::ExpDigits)
    }
}

/// The range keywords of a schema, as core reads them (`as_f64`; a boolean
/// `exclusiveMinimum` of draft 4 is no number and is ignored by both).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bounds {
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: Option<f64>,
    exclusive_maximum: Option<f64>,
}

impl Bounds {
    /// The bounds of a schema object, if it has any.
    pub(crate) fn of(obj: &Map<String, Value>) -> Option<Self> {
        let get = |key: &str| obj.get(key).and_then(Value::as_f64);
        let bounds = Bounds {
            minimum: get("minimum"),
            maximum: get("maximum"),
            exclusive_minimum: get("exclusiveMinimum"),
            exclusive_maximum: get("exclusiveMaximum"),
        };
        let any = bounds.minimum.is_some()
            || bounds.maximum.is_some()
            || bounds.exclusive_minimum.is_some()
            || bounds.exclusive_maximum.is_some();
        any.then_some(bounds)
    }

    /// Whether `x` fails a lower bound (the same comparisons as core).
    fn too_low(&self, x: f64) -> bool {
        self.minimum.is_some_and(|m| x < m) || self.exclusive_minimum.is_some_and(|m| x <= m)
    }

    /// Whether `x` fails an upper bound (the same comparisons as core).
    fn too_high(&self, x: f64) -> bool {
        self.maximum.is_some_and(|m| x > m) || self.exclusive_maximum.is_some_and(|m| x >= m)
    }

    /// Whether core accepts `x` under these bounds.
    pub(crate) fn admits(&self, x: f64) -> bool {
        !self.too_low(x) && !self.too_high(x)
    }
}

/// A prefix of a number literal: phase, sign and the digits so far as an
/// integer significand (`sig / 10^frac`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Prefix {
    pub(crate) ph: NumPh,
    neg: bool,
    sig: u64,
    digits: u8,
    frac: u8,
}

impl Prefix {
    /// Nothing read yet.
    pub(crate) const START: Prefix = Prefix { ph: NumPh::Start, neg: false, sig: 0, digits: 0, frac: 0 };

    /// The prefix after `b` in the syntax of a bounded number (no exponent;
    /// no fraction when `integer`), or `None` when `b` cannot follow.
    pub(crate) fn next_bounded(self, b: u8, integer: bool) -> Option<Prefix> {
        let digit = |ph: NumPh| {
            if self.digits >= MAX_BOUNDED_DIGITS {
                return None;
            }
            let d = u64::from(b - b'0');
            Some(Prefix {
                ph,
                sig: self.sig * 10 + d,
                digits: self.digits + 1,
                frac: self.frac + u8::from(ph == NumPh::Frac),
                ..self
            })
        };
        match (self.ph, b) {
            (NumPh::Start, b'-') => Some(Prefix { ph: NumPh::Minus, neg: true, ..self }),
            (NumPh::Start | NumPh::Minus, b'0') => digit(NumPh::Zero),
            (NumPh::Start | NumPh::Minus, b'1'..=b'9') => digit(NumPh::Int),
            (NumPh::Int, b'0'..=b'9') => digit(NumPh::Int),
            (NumPh::Zero | NumPh::Int, b'.') if !integer => Some(Prefix { ph: NumPh::Dot, ..self }),
            (NumPh::Dot | NumPh::Frac, b'0'..=b'9') => digit(NumPh::Frac),
            _ => None,
        }
    }

    /// The phase after `b` in the syntax of an unbounded number (exponent
    /// allowed, at most two exponent digits; no fraction or exponent when
    /// `integer`). Only the phase and the exponent's digits are tracked.
    pub(crate) fn next_unbounded(self, b: u8, integer: bool) -> Option<Prefix> {
        let ph = match (self.ph, b) {
            (NumPh::Start, b'-') => NumPh::Minus,
            (NumPh::Start | NumPh::Minus, b'0') => NumPh::Zero,
            (NumPh::Start | NumPh::Minus, b'1'..=b'9') => NumPh::Int,
            (NumPh::Int, b'0'..=b'9') => NumPh::Int,
            (NumPh::Zero | NumPh::Int, b'.') if !integer => NumPh::Dot,
            (NumPh::Dot | NumPh::Frac, b'0'..=b'9') => NumPh::Frac,
            (NumPh::Zero | NumPh::Int | NumPh::Frac, b'e' | b'E') if !integer => NumPh::Exp,
            (NumPh::Exp, b'+' | b'-') => NumPh::ExpSign,
            // At most two exponent digits: serde_json refuses a value
            // beyond the range of f64 ("number out of range").
            (NumPh::Exp | NumPh::ExpSign, b'0'..=b'9') => {
                return Some(Prefix { ph: NumPh::ExpDigits, digits: 1, ..self });
            }
            (NumPh::ExpDigits, b'0'..=b'9') if self.digits < 2 => {
                return Some(Prefix { ph: NumPh::ExpDigits, digits: self.digits + 1, ..self });
            }
            _ => return None,
        };
        Some(Prefix { ph, ..self })
    }

    /// The value `serde_json` parses from this (complete, bounded) literal.
    pub(crate) fn value(self) -> f64 {
        signed(self.neg, self.sig, self.frac)
    }

    /// The values of the smallest and the largest completion.
    fn range(self, integer: bool) -> (f64, f64) {
        let left = u32::from(MAX_BOUNDED_DIGITS.saturating_sub(self.digits));
        let widen = |sig: u64| sig * 10u64.pow(left) + (10u64.pow(left) - 1);
        let (low_sig, low_frac) = (self.sig, self.frac);
        let (high_sig, high_frac) = match self.ph {
            NumPh::Start | NumPh::Minus => (widen(0), 0),
            NumPh::Zero if integer => (0, 0),
            // More integer digits beat any fraction.
            NumPh::Int => (widen(self.sig), self.frac),
            _ => (widen(self.sig), self.frac + left as u8),
        };
        let low = signed(false, low_sig, low_frac);
        let high = signed(false, high_sig, high_frac);
        match self.ph {
            NumPh::Start => (-high, high),
            _ if self.neg => (-high, -low),
            _ => (low, high),
        }
    }

    /// Whether some completion of this prefix is a value `bounds` admits.
    /// Only branches that straddle a bound are searched, at most two per
    /// digit position, each at most [`MAX_BOUNDED_DIGITS`] deep.
    pub(crate) fn feasible(self, integer: bool, bounds: &Bounds) -> bool {
        let (low, high) = self.range(integer);
        if bounds.too_low(high) || bounds.too_high(low) {
            return false;
        }
        if bounds.admits(low) && bounds.admits(high) {
            return true;
        }
        if self.ph.can_end() && bounds.admits(self.value()) {
            return true;
        }
        b"-0123456789.".iter().any(|&b| self.next_bounded(b, integer).is_some_and(|p| p.feasible(integer, bounds)))
    }
}

fn signed(neg: bool, sig: u64, frac: u8) -> f64 {
    // `sig < 10^15 < 2^53` is exact; the division rounds once, as serde_json's.
    let magnitude = sig as f64 / POW10.get(usize::from(frac)).copied().unwrap_or(f64::INFINITY);
    if neg { -magnitude } else { magnitude }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bounds(schema: Value) -> Bounds {
        Bounds::of(schema.as_object().unwrap()).unwrap()
    }

    fn parse(text: &str, integer: bool) -> Option<Prefix> {
        text.bytes().try_fold(Prefix::START, |p, b| p.next_bounded(b, integer))
    }

    #[test]
    fn values_are_what_serde_json_parses() {
        for text in
            ["0", "-0", "7", "-12", "0.1", "0.3", "-2.5", "123456789012.345", "999999999999999", "0.00000000000001"]
        {
            let p = parse(text, false).unwrap();
            let parsed: Value = serde_json::from_str(text).unwrap();
            assert_eq!(p.value(), parsed.as_f64().unwrap(), "{text}");
        }
        assert!(parse("1234567890123456", false).is_none(), "16 digits");
        assert!(parse("1.5", true).is_none());
        assert!(parse("01", false).is_none());
    }

    #[test]
    fn feasibility_follows_the_bounds() {
        let b = bounds(json!({"minimum": 1}));
        assert!(!parse("0", true).unwrap().feasible(true, &b));
        assert!(!parse("-", true).unwrap().feasible(true, &b));
        assert!(parse("1", true).unwrap().feasible(true, &b));
        let b = bounds(json!({"exclusiveMinimum": 0.3, "maximum": 0.30000000000001}));
        assert!(!b.admits(parse("0.3", false).unwrap().value()), "0.3 parses to the bound itself");
        assert!(parse("0.30000000000001", false).unwrap().feasible(false, &b));
        let b = bounds(json!({"minimum": -5, "exclusiveMaximum": -4}));
        assert!(parse("-4", false).unwrap().feasible(false, &b), "-4.5 is still reachable");
        assert!(!parse("-4", true).unwrap().feasible(true, &b));
        assert!(parse("-5", true).unwrap().feasible(true, &b));
        let b = bounds(json!({"minimum": 2, "maximum": 1}));
        assert!(!Prefix::START.feasible(false, &b));
        let b = bounds(json!({"minimum": 0.2, "maximum": 0.21}));
        assert!(!Prefix::START.feasible(true, &b));
        assert!(Prefix::START.feasible(false, &b));
    }
}
