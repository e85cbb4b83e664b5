//! Fuzz target for 9P message decoding as `cairn serve` does it (the
//! `ninep` codec, bounded by the negotiated msize): any bytes decode or are
//! refused, never panic; a decoded message encodes to exactly the bytes it
//! was read from, and a stream of messages is read one after another until
//! the first refusal (what a connection does before it is closed).
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
        assert_eq!(&again[..], &data[start..end], "{message:?} re-encoded differently");
    }
});
