//! A server's form (MCP elicitation's restricted JSON Schema) as fields a
//! person fills in one by one, and each typed answer read against its
//! field: a value, left out, or the reason it was refused.
//!
//! MCP allows an object of primitive properties only: strings (lengths,
//! the formats email/uri/date/date-time), numbers and integers (bounds),
//! booleans, single-select enums (`enum`, titled `oneOf`, legacy
//! `enumNames`) and multi-select enums (an array of those), each with an
//! optional default. Anything else is refused whole ([`FormError`]) so a
//! face declines, saying why, rather than send a half-filled answer.
//!
//! It owns reading and checking only: it must not ask anyone (the face
//! prompts and re-asks with the reason given here).

use serde_json::{Number, Value};

/// Why a schema is not a form cairn can put to a person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormError {
    /// The schema is not an object of properties.
    #[error("the server's form is not an object of fields (MCP asks for {{\"type\": \"object\", \"properties\": …}})")]
    NotAnObject,
    /// One field is not a primitive MCP allows.
    #[error(
        "the server's field `{field}` is {why}: MCP forms allow strings, numbers, integers, booleans and enums only"
    )]
    Unsupported {
        /// The field's name.
        field: String,
        /// What it was.
        why: String,
    },
}

/// The string formats MCP allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// An email address.
    Email,
    /// An absolute URI (`scheme:rest`).
    Uri,
    /// A calendar date, `YYYY-MM-DD`.
    Date,
    /// An RFC 3339 date and time, `YYYY-MM-DDTHH:MM:SS` with a zone.
    DateTime,
}

impl Format {
    /// How the format is named to a person.
    pub fn name(self) -> &'static str {
        match self {
            Format::Email => "email address",
            Format::Uri => "URI",
            Format::Date => "date YYYY-MM-DD",
            Format::DateTime => "date-time YYYY-MM-DDTHH:MM:SSZ",
        }
    }
}

/// One option of an enum field.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The value sent when it is chosen.
    pub value: Value,
    /// What the server calls it for a person, if it says.
    pub title: Option<String>,
}

impl Choice {
    /// The option as shown: its title, else its value.
    pub fn label(&self) -> String {
        self.title.clone().unwrap_or_else(|| plain(&self.value))
    }
}

/// What a field holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// Free text.
    Text {
        /// Fewest characters.
        min_len: Option<u64>,
        /// Most characters.
        max_len: Option<u64>,
        /// The format it must have, if any.
        format: Option<Format>,
    },
    /// A number (`integer`: a whole one).
    Number {
        /// Only whole numbers.
        integer: bool,
        /// Least value.
        minimum: Option<f64>,
        /// Greatest value.
        maximum: Option<f64>,
    },
    /// Yes or no.
    Boolean,
    /// One of the options.
    One(Vec<Choice>),
    /// Some of the options.
    Many {
        /// The options.
        options: Vec<Choice>,
        /// Fewest chosen.
        min: Option<u64>,
        /// Most chosen.
        max: Option<u64>,
    },
}

/// One field of a form.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// The property's name (the key of the answer).
    pub name: String,
    /// What the server calls it for a person, if it says.
    pub title: Option<String>,
    /// The server's explanation, if any.
    pub description: Option<String>,
    /// Whether an answer is required.
    pub required: bool,
    /// What it holds.
    pub kind: Kind,
    /// The value an empty answer takes, if the server gave one.
    pub default: Option<Value>,
}

/// The fields of `schema`: required ones first in the order the server
/// listed them (the only order the schema keeps once parsed), then the
/// others by name.
pub fn form(schema: &Value) -> Result<Vec<Field>, FormError> {
    let props = match schema.get("properties") {
        Some(Value::Object(props)) => props,
        None if schema.get("type").and_then(Value::as_str) == Some("object") => return Ok(Vec::new()),
        _ => return Err(FormError::NotAnObject),
    };
    let required: Vec<&str> = schema.get("required").and_then(Value::as_array).map_or_else(Vec::new, |r| {
        r.iter().filter_map(Value::as_str).filter(|name| props.contains_key(*name)).collect()
    });
    let mut names: Vec<&str> = Vec::new();
    for name in &required {
        if !names.contains(name) {
            names.push(name);
        }
    }
    names.extend(props.keys().map(String::as_str).filter(|name| !required.contains(name)));
    names
        .into_iter()
        .filter_map(|name| props.get(name).map(|prop| (name, prop)))
        .map(|(name, prop)| field(name, prop, required.contains(&name)))
        .collect()
}

fn field(name: &str, prop: &Value, required: bool) -> Result<Field, FormError> {
    let unsupported = |why: String| FormError::Unsupported { field: name.to_owned(), why };
    let text = |key: &str| prop.get(key).and_then(Value::as_str).map(str::to_owned);
    let count = |key: &str| prop.get(key).and_then(Value::as_u64);
    let kind = match prop.get("type").and_then(Value::as_str) {
        Some("string") => match choices(prop) {
            Some(options) => Kind::One(options),
            None => {
                let format = match prop.get("format").and_then(Value::as_str) {
                    None => None,
                    Some("email") => Some(Format::Email),
                    Some("uri") => Some(Format::Uri),
                    Some("date") => Some(Format::Date),
                    Some("date-time") => Some(Format::DateTime),
                    Some(other) => return Err(unsupported(format!("a string of format `{other}`"))),
                };
                Kind::Text { min_len: count("minLength"), max_len: count("maxLength"), format }
            }
        },
        Some(t @ ("number" | "integer")) => Kind::Number {
            integer: t == "integer",
            minimum: prop.get("minimum").and_then(Value::as_f64),
            maximum: prop.get("maximum").and_then(Value::as_f64),
        },
        Some("boolean") => Kind::Boolean,
        Some("array") => match prop.get("items").and_then(choices) {
            Some(options) => Kind::Many { options, min: count("minItems"), max: count("maxItems") },
            None => return Err(unsupported("a list of something other than enum options".to_owned())),
        },
        Some(other) => return Err(unsupported(format!("of type `{other}`"))),
        None => return Err(unsupported("without a type".to_owned())),
    };
    Ok(Field {
        name: name.to_owned(),
        title: text("title"),
        description: text("description"),
        required,
        kind,
        default: prop.get("default").cloned(),
    })
}

/// The options of an enum schema (`enum` with optional `enumNames`, or
/// `oneOf`/`anyOf` of `{const, title}`); None when it is not one.
fn choices(schema: &Value) -> Option<Vec<Choice>> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let names = schema.get("enumNames").and_then(Value::as_array);
        return Some(
            values
                .iter()
                .enumerate()
                .map(|(i, value)| Choice {
                    value: value.clone(),
                    title: names.and_then(|n| n.get(i)).and_then(Value::as_str).map(str::to_owned),
                })
                .collect(),
        );
    }
    let list = schema.get("oneOf").or_else(|| schema.get("anyOf"))?.as_array()?;
    list.iter()
        .map(|option| {
            Some(Choice {
                value: option.get("const")?.clone(),
                title: option.get("title").and_then(Value::as_str).map(str::to_owned),
            })
        })
        .collect()
}

/// A value as a person reads it (strings unquoted).
pub fn plain(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "yes".to_owned(),
        Value::Bool(false) => "no".to_owned(),
        Value::Array(items) => items.iter().map(plain).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

impl Field {
    /// The field's name for a person: its title, else its key.
    pub fn label(&self) -> &str {
        self.title.as_deref().unwrap_or(&self.name)
    }

    /// What is asked for, in a few words (`whole number 0–150`, `email
    /// address`, `yes/no`, `one of the numbers above`).
    pub fn hint(&self) -> String {
        let bounds = |lo: Option<String>, hi: Option<String>| match (lo, hi) {
            (Some(lo), Some(hi)) => Some(format!("{lo} to {hi}")),
            (Some(lo), None) => Some(format!("at least {lo}")),
            (None, Some(hi)) => Some(format!("at most {hi}")),
            (None, None) => None,
        };
        let count = |n: &Option<u64>| n.map(|n| n.to_string());
        match &self.kind {
            Kind::Text { min_len, max_len, format } => {
                let what = format.map_or("text", Format::name);
                match bounds(count(min_len), count(max_len)) {
                    Some(len) => format!("{what}, length {len}"),
                    None => what.to_owned(),
                }
            }
            Kind::Number { integer, minimum, maximum } => {
                let what = if *integer { "whole number" } else { "number" };
                match bounds(minimum.map(num), maximum.map(num)) {
                    Some(range) => format!("{what} {range}"),
                    None => what.to_owned(),
                }
            }
            Kind::Boolean => "y/n".to_owned(),
            Kind::One(_) => "one of the options: its number or its name".to_owned(),
            Kind::Many { min, max, .. } => {
                let what = "options by number or name, separated by commas";
                match bounds(count(min), count(max)) {
                    Some(n) => format!("{what}; {n}"),
                    None => what.to_owned(),
                }
            }
        }
    }

    /// The options a person picks from (enum fields), in order.
    pub fn options(&self) -> &[Choice] {
        match &self.kind {
            Kind::One(options) | Kind::Many { options, .. } => options,
            _ => &[],
        }
    }

    /// Read what a person typed. An empty answer takes the default, or
    /// leaves an optional field out (`Ok(None)`); `Err` says what was
    /// wrong, for asking again.
    pub fn read(&self, typed: &str) -> Result<Option<Value>, String> {
        let typed = typed.trim();
        if typed.is_empty() {
            return match (&self.default, self.required) {
                (Some(default), _) => Ok(Some(default.clone())),
                (None, false) => Ok(None),
                (None, true) => Err("an answer is required".to_owned()),
            };
        }
        self.parse(typed).map(Some)
    }

    fn parse(&self, typed: &str) -> Result<Value, String> {
        match &self.kind {
            Kind::Text { min_len, max_len, format } => {
                let chars = typed.chars().count() as u64;
                if let Some(min) = min_len.filter(|min| chars < *min) {
                    return Err(format!("at least {min} characters are needed ({chars} given)"));
                }
                if let Some(max) = max_len.filter(|max| chars > *max) {
                    return Err(format!("at most {max} characters are allowed ({chars} given)"));
                }
                if let Some(format) = format {
                    check_format(*format, typed)?;
                }
                Ok(Value::String(typed.to_owned()))
            }
            Kind::Number { integer, minimum, maximum } => {
                let (value, json) = if *integer {
                    let whole = typed
                        .parse::<i64>()
                        .map_err(|_| format!("`{typed}` is not a whole number (digits only, like 42)"))?;
                    (whole as f64, Value::from(whole))
                } else {
                    let value = typed
                        .parse::<f64>()
                        .ok()
                        .filter(|v| v.is_finite())
                        .ok_or_else(|| format!("`{typed}` is not a number (like 42 or 2.5)"))?;
                    (value, Number::from_f64(value).map_or(Value::Null, Value::Number))
                };
                if let Some(min) = minimum.filter(|min| value < *min) {
                    return Err(format!("{typed} is less than the least allowed, {}", num(min)));
                }
                if let Some(max) = maximum.filter(|max| value > *max) {
                    return Err(format!("{typed} is more than the most allowed, {}", num(max)));
                }
                Ok(json)
            }
            Kind::Boolean => match typed.to_ascii_lowercase().as_str() {
                "y" | "yes" | "true" => Ok(Value::Bool(true)),
                "n" | "no" | "false" => Ok(Value::Bool(false)),
                _ => Err(format!("`{typed}` is not yes or no (y/n)")),
            },
            Kind::One(options) => pick(options, typed),
            Kind::Many { options, min, max } => {
                let mut chosen: Vec<Value> = Vec::new();
                for part in typed.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    let value = pick(options, part)?;
                    if !chosen.contains(&value) {
                        chosen.push(value);
                    }
                }
                let n = chosen.len() as u64;
                if let Some(min) = min.filter(|min| n < *min) {
                    return Err(format!("choose at least {min} ({n} chosen)"));
                }
                if let Some(max) = max.filter(|max| n > *max) {
                    return Err(format!("choose at most {max} ({n} chosen)"));
                }
                Ok(Value::Array(chosen))
            }
        }
    }
}

/// The option `typed` names: its value, its title (any case) or its
/// number in the list (1-based), in that order of preference.
fn pick(options: &[Choice], typed: &str) -> Result<Value, String> {
    if let Some(c) = options.iter().find(|c| plain(&c.value) == typed) {
        return Ok(c.value.clone());
    }
    if let Some(c) = options.iter().find(|c| c.title.as_deref().is_some_and(|t| t.eq_ignore_ascii_case(typed))) {
        return Ok(c.value.clone());
    }
    if let Some(c) = typed.parse::<usize>().ok().and_then(|n| n.checked_sub(1)).and_then(|i| options.get(i)) {
        return Ok(c.value.clone());
    }
    let names: Vec<String> = options.iter().map(Choice::label).collect();
    Err(format!("`{typed}` is not one of the options ({}); type its number or its name", names.join(", ")))
}

fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 { format!("{}", v as i64) } else { v.to_string() }
}

fn check_format(format: Format, typed: &str) -> Result<(), String> {
    let ok = match format {
        Format::Email => email(typed),
        Format::Uri => uri(typed),
        Format::Date => date(typed),
        Format::DateTime => date_time(typed),
    };
    if ok { Ok(()) } else { Err(format!("`{typed}` is not a valid {}", format.name())) }
}

/// `local@domain.tld`, no spaces: what a person can be told to fix (the
/// full grammar of RFC 5322 is not what a form asks for).
fn email(s: &str) -> bool {
    let Some((local, domain)) = s.split_once('@') else { return false };
    !local.is_empty()
        && !domain.contains('@')
        && !s.chars().any(char::is_whitespace)
        && domain.split('.').count() >= 2
        && domain.split('.').all(|label| !label.is_empty())
}

/// `scheme:rest` (RFC 3986's scheme), no spaces.
fn uri(s: &str) -> bool {
    let Some((scheme, rest)) = s.split_once(':') else { return false };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        && !rest.is_empty()
        && !s.chars().any(char::is_whitespace)
}

fn digits(s: &str, n: usize) -> Option<u32> {
    (s.len() == n && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten()
}

/// `YYYY-MM-DD`, a day that exists.
fn date(s: &str) -> bool {
    let mut parts = s.split('-');
    let (Some(y), Some(m), Some(d), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let (Some(y), Some(m), Some(d)) = (digits(y, 4), digits(m, 2), digits(d, 2)) else { return false };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
}

/// RFC 3339: a date, `T`, `HH:MM:SS` with optional fraction, then `Z` or
/// `±HH:MM`.
fn date_time(s: &str) -> bool {
    let Some((day, time)) = s.split_once(['T', 't']) else { return false };
    if !date(day) {
        return false;
    }
    let (clock, zone) = match time.strip_suffix(['Z', 'z']) {
        Some(clock) => (clock, None),
        None => match time.rfind(['+', '-']) {
            Some(at) => (&time[..at], Some(&time[at + 1..])),
            None => return false,
        },
    };
    let clock = clock.split_once('.').map_or(clock, |(whole, fraction)| {
        if !fraction.is_empty() && fraction.bytes().all(|b| b.is_ascii_digit()) { whole } else { "" }
    });
    let hms: Vec<&str> = clock.split(':').collect();
    let in_range = |part: &str, max: u32| digits(part, 2).is_some_and(|v| v <= max);
    let zone_ok = zone.is_none_or(|z| z.split_once(':').is_some_and(|(h, m)| in_range(h, 23) && in_range(m, 59)));
    hms.len() == 3 && in_range(hms[0], 23) && in_range(hms[1], 59) && in_range(hms[2], 60) && zone_ok
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn signup() -> Value {
        json!({
            "type": "object",
            "properties": {
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "colour": {"type": "string", "enum": ["red", "green", "blue"], "default": "green"},
                "email": {"type": "string", "format": "email", "title": "Email"},
                "name": {"type": "string", "minLength": 1},
                "pet": {"type": "string", "oneOf": [{"const": "c", "title": "Cat"}, {"const": "d", "title": "Dog"}]},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 2},
                "when": {"type": "string", "format": "date"},
            },
            "required": ["name", "email", "age"],
        })
    }

    fn field<'a>(fields: &'a [Field], name: &str) -> &'a Field {
        fields.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("no field {name}"))
    }

    #[test]
    fn required_fields_come_first_in_the_servers_order() {
        let fields = form(&signup()).unwrap();
        let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["name", "email", "age", "colour", "pet", "tags", "when"]);
    }

    #[test]
    fn answers_are_read_against_their_field() {
        let fields = form(&signup()).unwrap();
        let age = field(&fields, "age");
        assert_eq!(age.read("36"), Ok(Some(json!(36))));
        assert!(age.read("old").unwrap_err().contains("not a whole number"));
        assert!(age.read("200").unwrap_err().contains("most allowed, 150"));
        assert!(age.read("").unwrap_err().contains("required"));
        let email = field(&fields, "email");
        assert!(email.read("ada").unwrap_err().contains("email address"));
        assert_eq!(email.read("ada@example.org"), Ok(Some(json!("ada@example.org"))));
        let colour = field(&fields, "colour");
        assert_eq!(colour.read(""), Ok(Some(json!("green"))), "the default");
        assert_eq!(colour.read("3"), Ok(Some(json!("blue"))), "by number");
        assert!(colour.read("purple").unwrap_err().contains("red, green, blue"));
        assert_eq!(field(&fields, "pet").read("dog"), Ok(Some(json!("d"))), "by title");
        let tags = field(&fields, "tags");
        assert_eq!(tags.read("a, 3, a"), Ok(Some(json!(["a", "c"]))));
        assert!(tags.read("a,b,c").unwrap_err().contains("at most 2"));
        let when = field(&fields, "when");
        assert_eq!(when.read(""), Ok(None), "optional, no default: left out");
        assert!(when.read("2026-02-30").is_err());
        assert!(when.read("2024-02-29").is_ok());
    }

    #[test]
    fn formats_and_booleans() {
        let f = |format: &str| {
            form(&json!({"type": "object", "properties": {"x": {"type": "string", "format": format}}}))
                .unwrap()
                .remove(0)
        };
        assert!(f("uri").read("https://example.org/a").is_ok());
        assert!(f("uri").read("no scheme").is_err());
        assert!(f("date-time").read("2026-12-08T01:02:03Z").is_ok());
        assert!(f("date-time").read("2026-12-08T01:02:03.5+01:00").is_ok());
        assert!(f("date-time").read("2026-12-08 01:02").is_err());
        let b = form(&json!({"type": "object", "properties": {"x": {"type": "boolean", "default": false}}}))
            .unwrap()
            .remove(0);
        assert_eq!(b.read("Y"), Ok(Some(json!(true))));
        assert_eq!(b.read(""), Ok(Some(json!(false))));
        assert!(b.read("maybe").is_err());
    }

    #[test]
    fn what_mcp_does_not_allow_is_refused_whole() {
        let nested = json!({"type": "object", "properties": {"x": {"type": "object"}}});
        assert!(matches!(form(&nested), Err(FormError::Unsupported { field, .. }) if field == "x"));
        assert_eq!(form(&json!("text")), Err(FormError::NotAnObject));
    }
}
