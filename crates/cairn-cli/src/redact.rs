//! The PostgreSQL URL as it may be shown: without its password. Its own
//! module because configuration, errors and the database commands all show
//! URLs, and none of them may depend on the others for it.

/// The URL without its password (for messages and `cairn config`).
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.find(':') {
                Some(colon) => format!("{}{}:***{}", &url[..scheme + 3], &creds[..colon], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url
            .split_whitespace()
            .map(|kv| if kv.starts_with("password=") { "password=***" } else { kv })
            .collect::<Vec<_>>()
            .join(" "),
    }
}
