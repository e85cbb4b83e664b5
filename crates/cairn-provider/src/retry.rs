//! Retry policy: which failures are retried, and how long to wait.
//!
//! This module owns the pure decisions (retryable statuses, exponential
//! backoff with jitter, `retry-after` / `retry-after-ms` parsing). It must
//! not sleep or do I/O itself, so every rule is unit-tested without a clock.

use std::time::{Duration, SystemTime};

/// How a provider retries one call.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Total attempts, the first one included (1 = no retry).
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubles for each later one.
    pub initial_backoff: Duration,
    /// Upper bound of the exponential backoff.
    pub max_backoff: Duration,
    /// The longest `retry-after` honoured; a server asking for more ends the
    /// call with its error instead of blocking the session.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
        }
    }
}

/// HTTP statuses worth another attempt: request timeout, conflict, rate
/// limit, server errors and Anthropic's "overloaded" 529.
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429 | 500 | 502 | 503 | 504 | 529)
}

/// The server's requested delay, from `retry-after-ms` (milliseconds, may
/// be fractional) or `retry-after` (seconds, or an HTTP date).
pub fn parse_retry_after(retry_after_ms: Option<&str>, retry_after: Option<&str>, now: SystemTime) -> Option<Duration> {
    if let Some(ms) = retry_after_ms.and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = retry_after?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Some(Duration::from_secs_f64(secs));
        }
        return None;
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

impl RetryPolicy {
    /// The wait before attempt `next_attempt` (2 for the first retry):
    /// the server's `retry-after` when given, else exponential backoff with
    /// "equal jitter" (half fixed, half random) so that many clients hitting
    /// the same limit do not come back in lockstep. `random` is in [0, 1).
    pub fn delay(&self, next_attempt: u32, server_asked: Option<Duration>, random: f64) -> Duration {
        if let Some(asked) = server_asked {
            return asked;
        }
        let exponent = next_attempt.saturating_sub(2).min(30);
        let base = self.initial_backoff.saturating_mul(1u32 << exponent).min(self.max_backoff);
        let half = base / 2;
        half + half.mul_f64(random.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_statuses_are_exactly_the_documented_ones() {
        for s in [408, 409, 429, 500, 502, 503, 504, 529] {
            assert!(is_retryable_status(s), "{s}");
        }
        for s in [200, 400, 401, 403, 404, 413, 422, 501] {
            assert!(!is_retryable_status(s), "{s}");
        }
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(parse_retry_after(Some("250"), Some("9"), now), Some(Duration::from_millis(250)));
        assert_eq!(parse_retry_after(Some("12.5"), None, now), Some(Duration::from_micros(12_500)));
        assert_eq!(parse_retry_after(None, Some("7"), now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after(Some("junk"), Some("3"), now), Some(Duration::from_secs(3)));
        let date = httpdate::fmt_http_date(now + Duration::from_secs(42));
        assert_eq!(parse_retry_after(None, Some(&date), now), Some(Duration::from_secs(42)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(42));
        assert_eq!(parse_retry_after(None, Some(&past), now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(None, Some("-1"), now), None);
        assert_eq!(parse_retry_after(None, None, now), None);
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
            max_retry_after: Duration::from_secs(5),
        };
        assert_eq!(p.delay(2, None, 0.0), Duration::from_millis(50));
        assert_eq!(p.delay(2, None, 1.0), Duration::from_millis(100));
        assert_eq!(p.delay(3, None, 0.0), Duration::from_millis(100));
        assert_eq!(p.delay(4, None, 0.5), Duration::from_millis(300));
        assert_eq!(p.delay(9, None, 1.0), Duration::from_millis(1000));
        assert_eq!(p.delay(60, None, 1.0), Duration::from_millis(1000));
        assert_eq!(p.delay(2, Some(Duration::from_secs(3)), 0.7), Duration::from_secs(3));
    }
}
