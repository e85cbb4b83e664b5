//! Fuzz target for the session file's line parser: any bytes must decode to
//! records or to an error, never panic; whatever decodes must encode and
//! decode back to the same records; header decoding likewise.
#![no_main]

use cairn_core::storage::{decode_header, decode_line, encode_header, encode_line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(records) = decode_line(data) {
        let line = encode_line(&records).expect("decoded records encode");
        let again = decode_line(&line[..line.len() - 1]).expect("an encoded line decodes");
        assert_eq!(records, again, "line round trip");
    }
    if let Ok(header) = decode_header(data) {
        let line = encode_header(&header).expect("decoded header encodes");
        let again = decode_header(&line[..line.len() - 1]).expect("an encoded header decodes");
        assert_eq!(header, again, "header round trip");
    }
});
