//! `WWW-Authenticate` challenges (RFC 7235) as registries send them: `Bearer realm="…",
//! service="…",scope="…"` in any order, quoted or not, possibly several challenges in one header.
//! Pure parsing.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    /// Lower-cased: `bearer`, `basic`.
    pub(crate) scheme: String,
    /// Parameter names lower-cased; values unquoted.
    pub(crate) params: BTreeMap<String, String>,
}

impl Challenge {
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }
}

/// Parses one header value into its challenges. Malformed parts are skipped rather than failing
/// the whole header: a registry's odd formatting must not cost a lookup.
pub(crate) fn parse(header: &str) -> Vec<Challenge> {
    let mut cursor = Cursor {
        text: header.as_bytes(),
        at: 0,
    };
    let mut challenges: Vec<Challenge> = Vec::new();
    loop {
        cursor.skip(|b| b == b' ' || b == b'\t' || b == b',');
        let Some(word) = cursor.token() else { break };
        cursor.skip(|b| b == b' ' || b == b'\t');
        if cursor.peek() == Some(b'=') {
            // `name=value`: a parameter of the current challenge.
            cursor.at += 1;
            cursor.skip(|b| b == b' ' || b == b'\t');
            let value = if cursor.peek() == Some(b'"') {
                cursor.quoted()
            } else {
                cursor.token().unwrap_or_default()
            };
            if let Some(current) = challenges.last_mut() {
                current.params.insert(word.to_ascii_lowercase(), value);
            }
        } else {
            // A new scheme.
            challenges.push(Challenge {
                scheme: word.to_ascii_lowercase(),
                params: BTreeMap::new(),
            });
        }
        if cursor.at >= cursor.text.len() {
            break;
        }
    }
    challenges
}

struct Cursor<'a> {
    text: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn skip(&mut self, what: impl Fn(u8) -> bool) {
        while self.peek().is_some_and(&what) {
            self.at += 1;
        }
    }

    /// An RFC 7230 token (also accepts `/`, `:` and `.` for unquoted URLs and scopes).
    fn token(&mut self) -> Option<String> {
        let start = self.at;
        self.skip(|b| !matches!(b, b' ' | b'\t' | b',' | b'=' | b'"'));
        // Token68 values (`Basic dXNlcjpwYXNz==`) end in '='; keep a run of them when followed
        // by a separator, so they are not mistaken for a parameter.
        if self.at > start && self.peek() == Some(b'=') {
            let mut end = self.at;
            while self.text.get(end) == Some(&b'=') {
                end += 1;
            }
            if matches!(self.text.get(end), None | Some(b',') | Some(b' ')) && end > self.at + 1 {
                self.at = end;
            }
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.text[start..self.at]).into_owned())
    }

    /// A quoted string, with `\x` escapes; the cursor is on the opening quote.
    fn quoted(&mut self) -> String {
        self.at += 1;
        let mut out = Vec::new();
        while let Some(b) = self.peek() {
            self.at += 1;
            match b {
                b'\\' => {
                    if let Some(next) = self.peek() {
                        out.push(next);
                        self.at += 1;
                    }
                }
                b'"' => break,
                _ => out.push(b),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(header: &str) -> Challenge {
        let mut all = parse(header);
        assert_eq!(all.len(), 1, "{header}: {all:?}");
        all.remove(0)
    }

    #[test]
    fn bearer_in_any_order_quoted_or_not() {
        let headers = [
            r#"Bearer realm="https://auth.example.io/token",service="registry.example.io",scope="repository:org/app:pull""#,
            r#"Bearer scope="repository:org/app:pull", service="registry.example.io", realm="https://auth.example.io/token""#,
            r#"bearer service=registry.example.io,realm=https://auth.example.io/token,scope=repository:org/app:pull"#,
            r#"BEARER   realm = "https://auth.example.io/token" , scope="repository:org/app:pull",service="registry.example.io""#,
        ];
        for header in headers {
            let c = one(header);
            assert_eq!(c.scheme, "bearer", "{header}");
            assert_eq!(
                c.param("realm"),
                Some("https://auth.example.io/token"),
                "{header}"
            );
            assert_eq!(c.param("service"), Some("registry.example.io"), "{header}");
            assert_eq!(
                c.param("scope"),
                Some("repository:org/app:pull"),
                "{header}"
            );
        }
    }

    #[test]
    fn commas_and_escapes_inside_quotes() {
        let c = one(
            r#"Bearer realm="https://a/token",scope="repository:x:pull,push",error="insufficient_scope",note="a \"q\" b""#,
        );
        assert_eq!(c.param("scope"), Some("repository:x:pull,push"));
        assert_eq!(c.param("error"), Some("insufficient_scope"));
        assert_eq!(c.param("note"), Some(r#"a "q" b"#));
    }

    #[test]
    fn basic_and_several_challenges() {
        let c = one(r#"Basic realm="Registry Realm""#);
        assert_eq!(c.scheme, "basic");
        assert_eq!(c.param("realm"), Some("Registry Realm"));
        assert_eq!(one("Basic").scheme, "basic");

        let all = parse(r#"Basic realm="r1", Bearer realm="https://t/token",service="s""#);
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[0].scheme, "basic");
        assert_eq!(all[1].scheme, "bearer");
        assert_eq!(all[1].param("service"), Some("s"));
    }

    #[test]
    fn garbage_does_not_panic() {
        for header in [
            "",
            ",,,",
            "=",
            "Bearer realm=\"unterminated",
            "Bearer =x",
            "\"",
            "Bearer realm=",
            "a=b=c",
        ] {
            let _ = parse(header);
        }
        assert!(parse("").is_empty());
    }
}
