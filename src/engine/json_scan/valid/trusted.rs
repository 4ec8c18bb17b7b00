//! Walking checked text without checking it again: where a value ends, an object's members.
//! Every function here trusts the text is JSON ([`ValidJson`]'s proof) and only finds things.

use std::ops::Range;

use super::{special_bytes, ValidJson};

impl<'a> ValidJson<'a> {
    /// Past the whitespace at `at`.
    pub(crate) fn skip_whitespace(&self, mut at: usize) -> usize {
        let bytes = self.0.as_bytes();
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = bytes.get(at) {
            at += 1;
        }
        at
    }

    /// Just past the end of the value that starts at `at` (no whitespace before it). Checks
    /// nothing: strings are skipped to their closing quote, containers to the bracket that
    /// closes them; a scalar ends at the first byte that cannot be in one.
    pub(crate) fn skip_value(&self, at: usize) -> usize {
        let bytes = self.0.as_bytes();
        match bytes.get(at) {
            Some(b'"') => string_end(bytes, at),
            Some(b'{' | b'[') => container_end(bytes, at),
            _ => {
                let mut at = at;
                while let Some(byte) = bytes.get(at) {
                    if matches!(byte, b',' | b'}' | b']' | b' ' | b'\n' | b'\t' | b'\r') {
                        break;
                    }
                    at += 1;
                }
                at
            }
        }
    }

    /// The members of the object this text is (whitespace around it allowed); `None` when it
    /// is another kind of value.
    pub(crate) fn members(&self) -> Option<Members<'a>> {
        let at = self.skip_whitespace(0);
        (self.0.as_bytes().get(at) == Some(&b'{')).then_some(Members {
            json: *self,
            at: at + 1,
        })
    }
}

impl<'a> ValidJson<'a> {
    /// The elements of the array this text is (whitespace around it allowed); `None` when it
    /// is another kind of value.
    pub(crate) fn elements(&self) -> Option<Elements<'a>> {
        let at = self.skip_whitespace(0);
        (self.0.as_bytes().get(at) == Some(&b'[')).then_some(Elements {
            json: *self,
            at: at + 1,
        })
    }
}

/// An array's elements in order ([`ValidJson::elements`]).
pub(crate) struct Elements<'a> {
    json: ValidJson<'a>,
    /// Just past the `[` or the last element.
    at: usize,
}

impl<'a> Iterator for Elements<'a> {
    type Item = ValidJson<'a>;

    fn next(&mut self) -> Option<ValidJson<'a>> {
        let json = self.json;
        let bytes = json.0.as_bytes();
        let mut at = json.skip_whitespace(self.at);
        if bytes.get(at) == Some(&b',') {
            at = json.skip_whitespace(at + 1);
        }
        if matches!(bytes.get(at), None | Some(b']')) {
            return None;
        }
        let end = json.skip_value(at);
        self.at = end;
        Some(json.span(at..end))
    }
}

/// An object's members in order ([`ValidJson::members`]).
pub(crate) struct Members<'a> {
    json: ValidJson<'a>,
    /// Just past the `{` or the last member's value.
    at: usize,
}

/// One member of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Member<'a> {
    /// The key as written, between its quotes (escapes left as they are).
    pub(crate) key: &'a str,
    pub(crate) value: ValidJson<'a>,
}

impl<'a> Members<'a> {
    /// The next member and where its value is in the object's text.
    pub(crate) fn next_at(&mut self) -> Option<(Member<'a>, Range<usize>)> {
        let json = self.json;
        let bytes = json.0.as_bytes();
        let mut at = json.skip_whitespace(self.at);
        if bytes.get(at) == Some(&b',') {
            at = json.skip_whitespace(at + 1);
        }
        if bytes.get(at) != Some(&b'"') {
            // `}`: the end.
            return None;
        }
        let key_end = string_end(bytes, at);
        let key = &json.0[at + 1..key_end - 1];
        // Past the whitespace, the colon and the whitespace after the key.
        let start = json.skip_whitespace(json.skip_whitespace(key_end) + 1);
        let end = json.skip_value(start);
        self.at = end;
        Some((
            Member {
                key,
                value: json.span(start..end),
            },
            start..end,
        ))
    }
}

impl<'a> Iterator for Members<'a> {
    type Item = Member<'a>;

    fn next(&mut self) -> Option<Member<'a>> {
        self.next_at().map(|(member, _)| member)
    }
}

/// Just past the closing quote of the string whose opening quote is at `at`.
fn string_end(bytes: &[u8], at: usize) -> usize {
    let mut at = at + 1;
    loop {
        while let Some(chunk) = bytes.get(at..at + 8) {
            let special = special_bytes(u64::from_le_bytes(chunk.try_into().expect("eight")));
            if special != 0 {
                at += special.trailing_zeros() as usize / 8;
                break;
            }
            at += 8;
        }
        match bytes.get(at) {
            Some(b'"') => return at + 1,
            // The escaped byte is skipped: it may be a quote.
            Some(b'\\') => at += 2,
            Some(_) => at += 1,
            None => return at,
        }
    }
}

/// Just past the bracket closing the container whose opening one is at `at`.
fn container_end(bytes: &[u8], at: usize) -> usize {
    let mut depth = 0usize;
    let mut at = at;
    while let Some(&byte) = bytes.get(at) {
        match byte {
            b'"' => {
                at = string_end(bytes, at);
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return at + 1;
                }
            }
            _ => {}
        }
        at += 1;
    }
    at
}
