//! Validation of tool arguments against the subset of JSON Schema that
//! cairn's tools use: `type` (one or a list), `properties`, `required`,
//! `additionalProperties` (bool or schema), `enum`, `const`, `items`,
//! `minItems`/`maxItems`, `minLength`/`maxLength`, `minimum`/`maximum`,
//! `exclusiveMinimum`/`exclusiveMaximum` (numbers), `anyOf`, and boolean
//! schemas. Other keywords are ignored (they constrain nothing here).
//!
//! Why not the `jsonschema` crate: it pulls a regex engine, a URL resolver
//! and more than doubles the core's build time for keywords no cairn tool
//! uses; this module is small enough to read and is tested below.
//!
//! It must not fetch anything (`$ref` to other documents is not followed).

use serde_json::Value;

/// Why a value does not satisfy a schema: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SchemaError {
    /// JSON pointer-like path to the offending value (`/` for the root).
    pub path: String,
    /// What is wrong, for the model.
    pub message: String,
}

/// Check `value` against `schema`.
pub fn validate(schema: &Value, value: &Value) -> Result<(), SchemaError> {
    check(schema, value, &mut String::new())
}

fn fail(path: &str, message: String) -> Result<(), SchemaError> {
    Err(SchemaError { path: if path.is_empty() { "/".to_owned() } else { path.to_owned() }, message })
}

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

fn has_type(value: &Value, name: &str) -> bool {
    match name {
        "integer" => {
            value.as_i64().is_some() || value.as_u64().is_some() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        other => type_name(value) == other,
    }
}

fn check(schema: &Value, value: &Value, path: &mut String) -> Result<(), SchemaError> {
    let obj = match schema {
        Value::Bool(true) => return Ok(()),
        Value::Bool(false) => return fail(path, "no value is allowed here".to_owned()),
        Value::Object(obj) => obj,
        _ => return Ok(()),
    };
    match obj.get("type") {
        Some(Value::String(t)) if !has_type(value, t) => {
            return fail(path, format!("expected {t}, got {}", type_name(value)));
        }
        Some(Value::Array(types)) if !types.iter().filter_map(Value::as_str).any(|t| has_type(value, t)) => {
            let names: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
            return fail(path, format!("expected one of {}, got {}", names.join("/"), type_name(value)));
        }
        _ => {}
    }
    if let Some(Value::Array(options)) = obj.get("enum")
        && !options.contains(value)
    {
        return fail(path, format!("{value} is not one of {}", Value::Array(options.clone())));
    }
    if let Some(expected) = obj.get("const")
        && expected != value
    {
        return fail(path, format!("must be {expected}"));
    }
    if let Some(Value::Array(options)) = obj.get("anyOf")
        && !options.iter().any(|s| check(s, value, &mut path.clone()).is_ok())
    {
        return fail(path, "matches none of the allowed shapes (anyOf)".to_owned());
    }
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(required)) = obj.get("required") {
                for key in required.iter().filter_map(Value::as_str) {
                    if !map.contains_key(key) {
                        return fail(path, format!("missing required property {key:?}"));
                    }
                }
            }
            let properties = obj.get("properties").and_then(Value::as_object);
            for (key, item) in map {
                let len = path.len();
                path.push('/');
                path.push_str(key);
                let result = match properties.and_then(|p| p.get(key)) {
                    Some(sub) => check(sub, item, path),
                    None => match obj.get("additionalProperties") {
                        Some(Value::Bool(false)) => {
                            let known: Vec<&str> =
                                properties.map(|p| p.keys().map(String::as_str).collect()).unwrap_or_default();
                            fail(path, format!("unknown property; allowed: {}", known.join(", ")))
                        }
                        Some(sub) => check(sub, item, path),
                        None => Ok(()),
                    },
                };
                path.truncate(len);
                result?;
            }
        }
        Value::Array(items) => {
            if let Some(min) = obj.get("minItems").and_then(Value::as_u64)
                && (items.len() as u64) < min
            {
                return fail(path, format!("needs at least {min} items"));
            }
            if let Some(max) = obj.get("maxItems").and_then(Value::as_u64)
                && (items.len() as u64) > max
            {
                return fail(path, format!("allows at most {max} items"));
            }
            if let Some(sub) = obj.get("items") {
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("/{i}"));
                    let result = check(sub, item, path);
                    path.truncate(len);
                    result?;
                }
            }
        }
        Value::String(s) => {
            let chars = s.chars().count() as u64;
            if let Some(min) = obj.get("minLength").and_then(Value::as_u64)
                && chars < min
            {
                return fail(path, format!("must be at least {min} characters"));
            }
            if let Some(max) = obj.get("maxLength").and_then(Value::as_u64)
                && chars > max
            {
                return fail(path, format!("must be at most {max} characters"));
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            let bound = |key: &str| obj.get(key).and_then(Value::as_f64);
            if let Some(min) = bound("minimum")
                && x < min
            {
                return fail(path, format!("must be ≥ {min}"));
            }
            if let Some(max) = bound("maximum")
                && x > max
            {
                return fail(path, format!("must be ≤ {max}"));
            }
            if let Some(min) = bound("exclusiveMinimum")
                && x <= min
            {
                return fail(path, format!("must be > {min}"));
            }
            if let Some(max) = bound("exclusiveMaximum")
                && x >= max
            {
                return fail(path, format!("must be < {max}"));
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn subset_keywords() {
        let schema = json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1},
                "mode": {"enum": ["append", "overwrite"]},
                "lines": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 2},
                "n": {"type": ["integer", "null"], "maximum": 10}
            },
            "required": ["path"],
            "additionalProperties": false
        });
        assert!(validate(&schema, &json!({"path": "a", "mode": "append", "lines": [1, 2], "n": null})).is_ok());
        let cases = [
            (json!("str"), "/"),
            (json!({}), "/"),
            (json!({"path": ""}), "/path"),
            (json!({"path": "a", "mode": "x"}), "/mode"),
            (json!({"path": "a", "lines": [1, -1]}), "/lines/1"),
            (json!({"path": "a", "lines": [1, 2, 3]}), "/lines"),
            (json!({"path": "a", "n": 11}), "/n"),
            (json!({"path": "a", "n": 1.5}), "/n"),
            (json!({"path": "a", "extra": 1}), "/extra"),
        ];
        for (value, path) in cases {
            let err = validate(&schema, &value).unwrap_err();
            assert_eq!(err.path, path, "{value}: {err}");
        }
        assert!(validate(&json!(true), &json!(1)).is_ok());
        assert!(validate(&json!(false), &json!(1)).is_err());
        assert!(validate(&json!({"anyOf": [{"type": "string"}, {"type": "null"}]}), &json!(1)).is_err());
    }

    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let keys = prop_oneof![
            Just("type".to_owned()),
            Just("properties".to_owned()),
            Just("required".to_owned()),
            Just("items".to_owned()),
            Just("enum".to_owned()),
            Just("minimum".to_owned()),
            Just("maxLength".to_owned()),
            Just("additionalProperties".to_owned()),
            Just("anyOf".to_owned()),
            "[a-z]{1,3}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|i| json!(i)),
            any::<f64>().prop_map(|f| json!(f)),
            prop_oneof![Just("object"), Just("string"), Just("integer"), Just("array"), Just("x")]
                .prop_map(|s| json!(s)),
        ];
        leaf.prop_recursive(4, 32, 5, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(keys.clone(), inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// Any schema against any value: an answer, never a panic.
        #[test]
        fn never_panics(schema in any_json(), value in any_json()) {
            let _ = validate(&schema, &value);
        }
    }
}
