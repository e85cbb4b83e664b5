//! Fuzz target for the SSE framing of cairn-provider: any bytes, cut into
//! chunks anywhere, must parse without panicking, to exactly the events and
//! the outcome (Ok, or which error) of the same bytes fed whole, and no
//! event may be larger than the bound allows.
#![no_main]

// The parser is compiled from its source file rather than through the
// cairn-provider crate, whose HTTP stack (ureq, rustls) would multiply the
// instrumented fuzz build's time for code this target never runs.
#[path = "../../crates/cairn-provider/src/sse.rs"]
#[allow(dead_code)]
mod sse;

use libfuzzer_sys::fuzz_target;
use sse::{SseError, SseEvent, SseParser};

const LIMIT: usize = 256;

fn run(chunks: &[&[u8]]) -> (Vec<SseEvent>, Result<(), SseError>) {
    let mut parser = SseParser::new(LIMIT);
    let mut out = Vec::new();
    for chunk in chunks {
        if let Err(e) = parser.feed(chunk, &mut out) {
            return (out, Err(e));
        }
    }
    let end = parser.finish();
    (out, end)
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, stream)) = data.split_first() else { return };
    let whole = run(&[stream]);
    // The bound is on raw bytes; an invalid UTF-8 byte decodes to U+FFFD
    // (three bytes), so the text may be up to three times larger.
    for event in &whole.0 {
        assert!(event.data.len() <= 3 * LIMIT && event.data.len() <= 3 * stream.len(), "event too large");
    }
    // Cut at every `step`-th byte (1..=8, from the first byte) and once at
    // a point chosen by the seed.
    let step = usize::from(seed % 8) + 1;
    let pieces: Vec<&[u8]> = stream.chunks(step).collect();
    assert_eq!(run(&pieces), whole, "split every {step} bytes");
    let at = usize::from(seed).min(stream.len());
    assert_eq!(run(&[&stream[..at], &stream[at..]]), whole, "split at {at}");
});
