//! A strict JSON scanner for the bytes of an AdmissionReview nobody reads: it checks them and
//! finds where values end, building nothing, at a fraction of what serde_json spends skipping
//! them (serde_json skips a value token by token through its generic reader; most of a real
//! Pod's bytes are `managedFields`, thousands of short tokens). It never decides what a body
//! means: whenever it answers `None` — text it does not accept, or anything unusual — the caller
//! reads the text with serde_json, whose answer (and error message) is the one that counts.
//!
//! What it accepts is a subset of what serde_json accepts (RFC 8259 as serde_json reads it: no
//! trailing commas, no leading zeros, no control characters in strings, the escapes `\" \\ \/
//! \b \f \n \r \t \uXXXX`), nested at most [`MAX_DEPTH`] levels below where a skip starts.

use std::ops::Range;

/// Deeper than this, [`Scanner::value`] gives up (serde_json skips any depth; a real Pod nests
/// about a dozen levels).
pub(crate) const MAX_DEPTH: u32 = 64;

/// Whether to go on with the members of an object after one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Next,
    /// Stop here: the rest of the object is not read, not even checked.
    Stop,
}

/// A cursor over JSON text.
pub(crate) struct Scanner<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Scanner<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self { text, pos: 0 }
    }

    /// The text of `range` (from [`Scanner::value`]).
    pub(crate) fn text(&self, range: Range<usize>) -> &'a str {
        &self.text[range]
    }

    fn byte(&self, at: usize) -> Option<u8> {
        self.text.as_bytes().get(at).copied()
    }

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.byte(self.pos) {
            self.pos += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    pub(crate) fn peek(&mut self) -> Option<u8> {
        self.whitespace();
        self.byte(self.pos)
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.byte(self.pos) == Some(byte)).then(|| self.pos += 1)
    }

    /// Whether only whitespace is left.
    pub(crate) fn end(&mut self) -> Option<()> {
        (self.peek().is_none()).then_some(())
    }

    /// A string starting at its opening quote; its raw text between the quotes (escapes left
    /// as they are).
    fn string(&mut self) -> Option<&'a str> {
        let bytes = self.text.as_bytes();
        let start = self.pos + 1;
        let mut at = start;
        loop {
            match *bytes.get(at)? {
                b'"' => break,
                b'\\' => {
                    at += match *bytes.get(at + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 2,
                        b'u' => {
                            let hex = bytes.get(at + 2..at + 6)?;
                            hex.iter().all(u8::is_ascii_hexdigit).then_some(6)?
                        }
                        _ => return None,
                    };
                }
                0..=0x1f => return None,
                _ => at += 1,
            }
        }
        self.pos = at + 1;
        Some(&self.text[start..at])
    }

    /// A number as serde_json reads one: `-`? (`0` | [1-9][0-9]*) (`.` [0-9]+)? ([eE] [+-]? [0-9]+)?
    fn number(&mut self) -> Option<()> {
        let digits = |s: &mut Self| {
            let first = s.pos;
            while let Some(b'0'..=b'9') = s.byte(s.pos) {
                s.pos += 1;
            }
            (s.pos > first).then_some(())
        };
        let _ = self.eat(b'-');
        match self.byte(self.pos)? {
            b'0' => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.byte(self.pos) {
                    return None;
                }
            }
            b'1'..=b'9' => digits(self)?,
            _ => return None,
        }
        if self.eat(b'.').is_some() {
            digits(self)?;
        }
        if let Some(b'e' | b'E') = self.byte(self.pos) {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.byte(self.pos) {
                self.pos += 1;
            }
            digits(self)?;
        }
        Some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.pos + word.len();
        (self.text.as_bytes().get(self.pos..end)? == word).then(|| self.pos = end)
    }

    /// An object's key and the colon after it; the key's raw text.
    fn key(&mut self) -> Option<&'a str> {
        if self.peek()? != b'"' {
            return None;
        }
        let key = self.string()?;
        (self.peek()? == b':').then(|| self.pos += 1)?;
        Some(key)
    }

    /// Skips one value (and the whitespace before it), checking it; where it was. Iterative,
    /// with the open objects and arrays as bits of one word: no allocation, no recursion.
    pub(crate) fn value(&mut self) -> Option<Range<usize>> {
        self.whitespace();
        let start = self.pos;
        // Bit i: whether the open container at depth i + 1 (from the top) is an object.
        let (mut open, mut depth) = (0u64, 0u32);
        'value: loop {
            match self.peek()? {
                opening @ (b'{' | b'[') => {
                    let closing = if opening == b'{' { b'}' } else { b']' };
                    self.pos += 1;
                    if self.peek()? != closing {
                        if depth == MAX_DEPTH {
                            return None;
                        }
                        open = open << 1 | u64::from(opening == b'{');
                        depth += 1;
                        if opening == b'{' {
                            self.key()?;
                        }
                        continue 'value;
                    }
                    self.pos += 1;
                }
                b'"' => {
                    self.string()?;
                }
                b'n' => self.literal(b"null")?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'-' | b'0'..=b'9' => self.number()?,
                _ => return None,
            }
            // After a value: close every container that ends here, then the next element.
            while depth > 0 {
                let object = open & 1 == 1;
                match self.peek()? {
                    b',' => {
                        self.pos += 1;
                        if object {
                            self.key()?;
                        }
                        continue 'value;
                    }
                    b'}' if object => {}
                    b']' if !object => {}
                    _ => return None,
                }
                self.pos += 1;
                open >>= 1;
                depth -= 1;
            }
            return Some(start..self.pos);
        }
    }

    /// The members of the object that starts here: `member` is called after each key (its raw
    /// text) and colon, and must consume the value ([`Scanner::value`], or an inner
    /// [`Scanner::object`]) unless it stops.
    pub(crate) fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a str) -> Option<Step>,
    ) -> Option<()> {
        (self.peek()? == b'{').then(|| self.pos += 1)?;
        if self.peek()? == b'}' {
            self.pos += 1;
            return Some(());
        }
        loop {
            let key = self.key()?;
            if member(self, key)? == Step::Stop {
                return Some(());
            }
            match self.peek()? {
                b',' => self.pos += 1,
                b'}' => {
                    self.pos += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// Where `request.object`'s value is in an AdmissionReview `body`, once the whole body has been
/// checked to be JSON; `None` when it is not JSON this scanner accepts, or has no such object.
/// Only the first `request` and its first `object` are looked at, by their keys as written (a
/// key spelled with escapes is not recognised): a second one, or one spelled otherwise, is for
/// serde_json to find (and refuse as a duplicate).
pub(crate) fn object_span(body: &str) -> Option<Range<usize>> {
    let mut scanner = Scanner::new(body);
    let mut span = None;
    let mut seen_request = false;
    scanner.object(|s, key| {
        if key == "request" && !seen_request && s.peek()? == b'{' {
            seen_request = true;
            let mut seen_object = false;
            s.object(|s, key| {
                let value = s.value()?;
                if key == "object" && !seen_object {
                    seen_object = true;
                    span = Some(value);
                }
                Some(Step::Next)
            })?;
        } else {
            s.value()?;
        }
        Some(Step::Next)
    })?;
    scanner.end()?;
    span
}

#[cfg(test)]
pub(crate) mod tests;
