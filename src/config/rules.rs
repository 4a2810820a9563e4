//! Pure rules that configuration validation and the data path share. They live here, in the
//! leaf, so that `mapping` and `postgres` call configuration rather than the reverse.

/// Longest Kafka topic name, in characters.
pub const MAX_TOPIC_CHARS: usize = 249;

/// Checks a topic name the way the broker will, so a bad one is caught before sending: `None`
/// when it is valid, else what is wrong with it.
pub fn topic_name_problem(topic: &str) -> Option<&'static str> {
    if topic.is_empty() {
        Some("empty")
    } else if topic.len() > MAX_TOPIC_CHARS {
        Some("longer than 249 characters")
    } else if topic == "." || topic == ".." {
        Some("`.` and `..` are reserved")
    } else if !topic.bytes().all(is_topic_byte) {
        Some("only ASCII letters, digits, `.`, `_` and `-` are allowed")
    } else {
        None
    }
}

/// A character Kafka allows in a topic name: `A-Z a-z 0-9 . _ -`.
pub fn is_topic_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// Removes `sslmode` and `sslrootcert` from a URL or `key=value` connection string: `(the rest,
/// sslmode, sslrootcert)`. tokio-postgres' parser knows neither `verify-ca` nor `verify-full`,
/// so these two parameters are read by the relay itself. `target_session_attrs` goes too: the
/// parser does not know all of libpq's values, and `postgres::conninfo` reads it itself.
pub fn split_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut mode, mut root) = (None, None);
    let mut take = |key: &str, value: &str| match key {
        "target_session_attrs" => true,
        "sslmode" => {
            mode = Some(value.to_string());
            true
        }
        "sslrootcert" => {
            root = Some(value.to_string());
            true
        }
        _ => false,
    };
    let rest = remove_params(url, |k, v| take(k, v));
    (rest, mode, root)
}

/// A URL or `key=value` connection string without the parameters `take` returns true for
/// (`take` sees each parameter's key and value, and may keep the value).
pub fn remove_params(url: &str, mut take: impl FnMut(&str, &str) -> bool) -> String {
    if let Some((base, query)) = url.split_once('?') {
        let kept: Vec<&str> = query
            .split('&')
            .filter(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                !take(k, v)
            })
            .collect();
        if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    } else if url.contains("://") {
        url.to_string()
    } else {
        url.split_whitespace()
            .filter(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                !take(k.trim(), v.trim())
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_are_checked_like_kafka_does() {
        assert_eq!(topic_name_problem("outbox.event.order_1-x"), None);
        assert_eq!(topic_name_problem(&"x".repeat(249)), None);
        for bad in ["", ".", "..", "a b", "ü", &"x".repeat(250)] {
            assert!(topic_name_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn tls_parameters_are_split_from_every_form() {
        assert_eq!(
            split_tls_params("postgres://u@db/app?sslmode=verify-full&sslrootcert=/ca.pem&x=1"),
            (
                "postgres://u@db/app?x=1".to_string(),
                Some("verify-full".to_string()),
                Some("/ca.pem".to_string())
            )
        );
        assert_eq!(
            split_tls_params("postgres://u@db/app?sslmode=require"),
            (
                "postgres://u@db/app".to_string(),
                Some("require".to_string()),
                None
            )
        );
        assert_eq!(
            split_tls_params("postgres://u@db/app"),
            ("postgres://u@db/app".to_string(), None, None)
        );
        assert_eq!(
            split_tls_params("host=db sslmode=verify-ca user=u"),
            (
                "host=db user=u".to_string(),
                Some("verify-ca".to_string()),
                None
            )
        );
    }
}
