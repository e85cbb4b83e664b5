//! The PostgreSQL URL as it may be shown: without its password. Its own
//! module because configuration, errors and the database commands all show
//! URLs, and none of them may depend on the others for it.

/// The URL without its password (for messages and `cairn config`), in any
/// of the shapes a person may write: `postgres://user:secret@host/db`
/// (and `?password=` in its query), key=value (`password=secret`, quoted
/// or not), and `user:secret@host/db` with no scheme — which PostgreSQL
/// does not accept, and whose error must not show the secret either.
pub fn redact(url: &str) -> String {
    match url.find("://") {
        Some(scheme) => {
            let (head, query) = match url.find('?') {
                Some(q) => (&url[..q], Some(&url[q + 1..])),
                None => (url, None),
            };
            let mut out = match head.rfind('@') {
                Some(at) if at > scheme => {
                    let creds = &head[scheme + 3..at];
                    match creds.find(':') {
                        Some(colon) => format!("{}{}:***{}", &head[..scheme + 3], &creds[..colon], &head[at..]),
                        None => head.to_owned(),
                    }
                }
                _ => head.to_owned(),
            };
            if let Some(query) = query {
                let params: Vec<String> = query
                    .split('&')
                    .map(|p| if p.starts_with("password=") { "password=***".to_owned() } else { p.to_owned() })
                    .collect();
                out.push('?');
                out.push_str(&params.join("&"));
            }
            out
        }
        None if url.contains('=') => redact_key_values(url),
        // No scheme and no key=value: `user:secret@host/db` (refused by
        // PostgreSQL, but still a secret).
        None => match url.rfind('@') {
            Some(at) => match url[..at].find(':') {
                Some(colon) => format!("{}:***{}", &url[..colon], &url[at..]),
                None => url.to_owned(),
            },
            None => url.to_owned(),
        },
    }
}

/// `text` (an error message about `url`) with the URL's password, should
/// the message quote it, replaced by `***`.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub fn scrub(text: &str, url: &str) -> String {
    let shown = redact(url);
    let mut out = text.replace(url, &shown);
    // The password is what redact took out: the text between the common
    // beginning and end of the URL and its redacted form.
    let prefix = url.bytes().zip(shown.bytes()).take_while(|(a, b)| a == b).count();
    let suffix = url[prefix..].bytes().rev().zip(shown[prefix..].bytes().rev()).take_while(|(a, b)| a == b).count();
    if let Some(secret) = url.get(prefix..url.len() - suffix) {
        let secret = secret.trim_matches('\'');
        if secret.len() >= 3 {
            out = out.replace(secret, "***");
        }
    }
    out
}

/// `key=value` pairs with the value of `password` replaced, whether it is
/// bare or single-quoted (with `\'` escapes, as libpq reads it).
fn redact_key_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("password") {
        let (before, after) = rest.split_at(pos);
        let boundary = before.is_empty() || before.ends_with(char::is_whitespace);
        let value = after["password".len()..].trim_start();
        if !(boundary && value.starts_with('=')) {
            out.push_str(&rest[..pos + "password".len()]);
            rest = &rest[pos + "password".len()..];
            continue;
        }
        out.push_str(before);
        out.push_str("password=***");
        let value = value[1..].trim_start();
        rest = if let Some(quoted) = value.strip_prefix('\'') {
            let mut end = quoted.len();
            let mut escaped = false;
            for (i, c) in quoted.char_indices() {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '\'' => {
                        end = i + 1;
                        break;
                    }
                    _ => {}
                }
            }
            &quoted[end..]
        } else {
            let end = value.find(char::is_whitespace).unwrap_or(value.len());
            &value[end..]
        };
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::{redact, scrub};

    #[test]
    fn an_error_quoting_the_password_is_scrubbed() {
        let url = "cairn:hunter2@host/db";
        assert_eq!(scrub("unknown option `cairn:hunter2@host/db`", url), "unknown option `cairn:***@host/db`");
        assert_eq!(scrub("bad hunter2 here", url), "bad *** here");
        assert_eq!(scrub("bad x", "host=h password=hunter2"), "bad x");
        assert_eq!(scrub("got hunter2", "host=h password=hunter2 user=u"), "got ***");
    }

    #[test]
    fn no_shape_shows_the_password() {
        for (url, want) in [
            ("postgres://cairn:secret@db/x", "postgres://cairn:***@db/x"),
            ("postgresql://cairn@db/x", "postgresql://cairn@db/x"),
            (
                "postgres://db/x?user=a&password=secret&sslmode=require",
                "postgres://db/x?user=a&password=***&sslmode=require",
            ),
            ("cairn:secret@host/db", "cairn:***@host/db"),
            ("host=db user=cairn password=secret dbname=x", "host=db user=cairn password=*** dbname=x"),
            ("host=db password = 'a b\\' c' dbname=x", "host=db password=*** dbname=x"),
            ("host=/tmp dbname=x", "host=/tmp dbname=x"),
        ] {
            let shown = redact(url);
            assert_eq!(shown, want, "{url}");
            assert!(!shown.contains("secret"), "{url}");
        }
    }
}
