//! Fuzz target for the JSON Schema subset validator: any schema with any
//! value validates or fails with an error naming a path, never panics; and
//! a few identities hold for every pair: wrapping the schema in `anyOf`
//! does not change the answer, a value always fits its own `const`, `enum`
//! and `type`, and the boolean schemas mean what they say.
#![no_main]

use cairn_core::schema::validate;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fuzz_target!(|data: &[u8]| {
    // Schema and value are separated by the first NUL byte.
    let Some(cut) = data.iter().position(|&b| b == 0) else { return };
    let (Ok(schema), Ok(value)) =
        (serde_json::from_slice::<Value>(&data[..cut]), serde_json::from_slice::<Value>(&data[cut + 1..]))
    else {
        return;
    };
    let verdict = validate(&schema, &value);
    if let Err(e) = &verdict {
        assert!(e.path.starts_with('/'), "error path {:?} for {schema} / {value}", e.path);
    }
    let wrapped = json!({"anyOf": [schema.clone()]});
    assert_eq!(validate(&wrapped, &value).is_ok(), verdict.is_ok(), "anyOf changed the answer: {schema} / {value}");
    assert!(validate(&json!({"const": value.clone()}), &value).is_ok(), "{value} does not fit its const");
    assert!(validate(&json!({"enum": [value.clone()]}), &value).is_ok(), "{value} does not fit its enum");
    assert!(validate(&json!({"type": type_name(&value)}), &value).is_ok(), "{value} does not fit its type");
    assert!(validate(&Value::Bool(true), &value).is_ok());
    assert!(validate(&Value::Bool(false), &value).is_err());
});
