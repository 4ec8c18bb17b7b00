//! A strict JSON scanner for the bytes of an AdmissionReview nobody reads: it checks them and
//! finds where values end — noting, for the few it is asked to look into, where their members
//! are, and building nothing else — at a fraction of what serde_json spends skipping them
//! (serde_json skips a value token by token through its generic reader; most of a real Pod's
//! bytes are `managedFields`, thousands of short tokens). It never decides what a body
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

    /// The elements of the array that starts here: `element` is called before each and must
    /// consume it, as [`Scanner::object`]'s `member` must.
    pub(crate) fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.items(b'[', b']', |s| element(s).map(|()| Step::Next))
    }

    /// The next byte after whitespace, not consumed.
    pub(crate) fn peek(&mut self) -> Option<u8> {
        self.pos = whitespace(self.text.as_bytes(), self.pos);
        self.text.as_bytes().get(self.pos).copied()
    }

    /// Whether only whitespace is left.
    pub(crate) fn end(&mut self) -> Option<()> {
        (self.peek().is_none()).then_some(())
    }

    /// Skips one value (and the whitespace before it), checking it; where it was.
    pub(crate) fn value(&mut self) -> Option<Range<usize>> {
        let bytes = self.text.as_bytes();
        let start = whitespace(bytes, self.pos);
        self.pos = skip_value(bytes, start)?;
        Some(start..self.pos)
    }

    /// An object's key, the colon and the whitespace after it; the key's raw text (escapes left
    /// as they are).
    fn key(&mut self) -> Option<&'a str> {
        let bytes = self.text.as_bytes();
        let start = whitespace(bytes, self.pos);
        self.pos = key_end(bytes, start)?;
        let quoted = &bytes[start..self.pos];
        let close = start + quoted.iter().rposition(|&b| b == b'"')?;
        Some(&self.text[start + 1..close])
    }

    /// The members of the object that starts here: `member` is called after each key (its raw
    /// text) and colon, and must consume the value ([`Scanner::value`], or an inner
    /// [`Scanner::object`]) unless it stops.
    pub(crate) fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a str) -> Option<Step>,
    ) -> Option<()> {
        self.items(b'{', b'}', |s| {
            let key = s.key()?;
            member(s, key)
        })
    }

    /// The items between `open` and `close` that start here, separated by commas: `item` is
    /// called before each and must consume it unless it stops.
    fn items(
        &mut self,
        open: u8,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<Step>,
    ) -> Option<()> {
        (self.peek()? == open).then(|| self.pos += 1)?;
        if self.peek()? == close {
            self.pos += 1;
            return Some(());
        }
        loop {
            if item(self)? == Step::Stop {
                return Some(());
            }
            match self.peek()? {
                b',' => self.pos += 1,
                byte if byte == close => {
                    self.pos += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

// The scan itself works on bytes and positions (kept in registers, not in the scanner): each
// function takes where something starts and answers where it ends, `None` for text it does not
// take.

/// Past the whitespace at `at`.
#[inline(always)]
fn whitespace(bytes: &[u8], mut at: usize) -> usize {
    // Most bodies are compact: one comparison when there is none (every JSON whitespace byte
    // is below `!`; what else is below it is for the caller to refuse).
    if bytes.get(at).is_none_or(|&b| b > b' ') {
        return at;
    }
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = bytes.get(at) {
        at += 1;
    }
    at
}

/// The value at `at` (no whitespace before it), checked: just past its end. Iterative, with
/// the open objects and arrays as bits of one word: no allocation, no recursion.
fn skip_value(bytes: &[u8], mut at: usize) -> Option<usize> {
    // Bit i: whether the open container at depth i + 1 (from the innermost) is an object.
    let (mut open, mut depth) = (0u64, 0u32);
    'value: loop {
        match *bytes.get(at)? {
            b'"' => at = string_end(bytes, at)?,
            opening @ (b'{' | b'[') => {
                let object = opening == b'{';
                at = whitespace(bytes, at + 1);
                if bytes.get(at) == Some(if object { &b'}' } else { &b']' }) {
                    at += 1;
                } else {
                    if depth == MAX_DEPTH {
                        return None;
                    }
                    open = open << 1 | u64::from(object);
                    depth += 1;
                    if object {
                        at = key_end(bytes, at)?;
                    }
                    continue 'value;
                }
            }
            b'n' => at = literal(bytes, at, b"null")?,
            b't' => at = literal(bytes, at, b"true")?,
            b'f' => at = literal(bytes, at, b"false")?,
            b'-' | b'0'..=b'9' => at = number_end(bytes, at)?,
            _ => return None,
        }
        // After a value: close every container that ends here, then on to the next element.
        while depth > 0 {
            at = whitespace(bytes, at);
            let object = open & 1 == 1;
            match *bytes.get(at)? {
                b',' => {
                    at = whitespace(bytes, at + 1);
                    if object {
                        at = key_end(bytes, at)?;
                    }
                    continue 'value;
                }
                b'}' if object => {}
                b']' if !object => {}
                _ => return None,
            }
            at += 1;
            open >>= 1;
            depth -= 1;
        }
        return Some(at);
    }
}

/// The key at `at` (a string), the colon and whitespace after it: where the value starts.
#[inline(always)]
fn key_end(bytes: &[u8], at: usize) -> Option<usize> {
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let at = whitespace(bytes, string_end(bytes, at)?);
    (bytes.get(at) == Some(&b':')).then(|| whitespace(bytes, at + 1))
}

/// The string whose opening quote is at `at`: just past its closing quote.
#[inline(always)]
fn string_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut at = at + 1;
    loop {
        // Eight bytes at a time up to the first that may end the run of plain ones.
        while let Some(chunk) = bytes.get(at..at + 8) {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            let special = special_bytes(word);
            if special != 0 {
                at += special.trailing_zeros() as usize / 8;
                break;
            }
            at += 8;
        }
        match *bytes.get(at)? {
            b'"' => return Some(at + 1),
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
}

/// The high bit of each byte of `word` that is `"`, `\\` or a control character (below 0x20),
/// exact up to the first one (bits above it may be set by a borrow, and are not looked at):
/// the bytes a string's scan must stop at, eight at a time.
#[inline(always)]
fn special_bytes(word: u64) -> u64 {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let zero_in = |w: u64| w.wrapping_sub(ONES) & !w;
    let control = word.wrapping_sub(ONES * 0x20) & !word;
    let quote = zero_in(word ^ (ONES * u64::from(b'"')));
    let backslash = zero_in(word ^ (ONES * u64::from(b'\\')));
    (control | quote | backslash) & HIGH
}

/// The number at `at`, as serde_json reads one:
/// `-`? (`0` | [1-9][0-9]*) (`.` [0-9]+)? ([eE] [+-]? [0-9]+)?; just past its end.
fn number_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    let digits = |mut at: usize| {
        let first = at;
        while let Some(b'0'..=b'9') = bytes.get(at) {
            at += 1;
        }
        (at > first).then_some(at)
    };
    if bytes.get(at) == Some(&b'-') {
        at += 1;
    }
    match *bytes.get(at)? {
        b'0' => {
            at += 1;
            if let Some(b'0'..=b'9') = bytes.get(at) {
                return None;
            }
        }
        b'1'..=b'9' => at = digits(at)?,
        _ => return None,
    }
    if bytes.get(at) == Some(&b'.') {
        at = digits(at + 1)?;
    }
    if let Some(b'e' | b'E') = bytes.get(at) {
        at += 1;
        if let Some(b'+' | b'-') = bytes.get(at) {
            at += 1;
        }
        at = digits(at)?;
    }
    Some(at)
}

/// `word` at `at`: just past it.
fn literal(bytes: &[u8], at: usize, word: &[u8]) -> Option<usize> {
    let end = at + word.len();
    (bytes.get(at..end)? == word).then_some(end)
}

/// A value the scanner checked: its text and, where the scan looked into it ([`Look`]), its
/// members, each a checked value of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Scanned<'a> {
    pub(crate) text: &'a str,
    pub(crate) inner: Inner<'a>,
}

/// What the scan found inside a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Inner<'a> {
    /// Not looked into, or not of the kind looked for (`null`, a string, …).
    Unread,
    /// An object's members in order (twice if written twice), keys as written (escapes left as
    /// they are).
    Members(Vec<(&'a str, Scanned<'a>)>),
}

impl<'a> Scanned<'a> {
    /// Whether the value is `null`.
    pub(crate) fn is_null(&self) -> bool {
        self.text == "null"
    }

    /// The value read by serde_json as a derived reader reads an `Option` field (`null` is
    /// `Some(None)`); `None` when serde_json refuses it.
    pub(crate) fn read<T: serde::de::DeserializeOwned>(&self) -> Option<Option<T>> {
        serde_json::from_str(self.text).ok()
    }

    /// The members, when the value is an object the scan looked into.
    pub(crate) fn members(&self) -> Option<impl Iterator<Item = (&'a str, &Scanned<'a>)>> {
        match &self.inner {
            Inner::Members(members) => Some(members.iter().map(|(key, value)| (*key, value))),
            Inner::Unread => None,
        }
    }

    /// [`Scanned::members`], taken.
    pub(crate) fn into_members(self) -> Option<Vec<(&'a str, Scanned<'a>)>> {
        match self.inner {
            Inner::Members(members) => Some(members),
            Inner::Unread => None,
        }
    }
}

/// Calls `read` with the index in `names` and the value of each member named there, once each,
/// as a derived reader takes an object's fields (others are ignored); `None` — the reader is
/// to be asked — as [`FieldsOnce::field`] says, or when `read` says `None`. The members are
/// given by reference ([`Scanned::members`]) or by value ([`Scanned::into_members`]).
pub(crate) fn read_fields<'a, V>(
    members: impl IntoIterator<Item = (&'a str, V)>,
    names: &[&str],
    mut read: impl FnMut(usize, V) -> Option<()>,
) -> Option<()> {
    let mut once = FieldsOnce::default();
    for (key, value) in members {
        if let Some(field) = once.field(names, key)? {
            read(field, value)?;
        }
    }
    Some(())
}

/// The fields of one object taken as a derived reader takes them: each named field once.
#[derive(Default)]
pub(crate) struct FieldsOnce {
    seen: u64,
}

impl FieldsOnce {
    /// Which of `names` (at most 64) the member `key` is, `Some(None)` for none of them; `None`
    /// — the reader is to be asked — for a key written with escapes (keys are compared as
    /// written) or a field written twice (an error for a derived reader).
    pub(crate) fn field(&mut self, names: &[&str], key: &str) -> Option<Option<usize>> {
        debug_assert!(names.len() <= 64);
        // No name has a backslash: only a key that names none is looked at for escapes.
        let Some(field) = names.iter().position(|name| *name == key) else {
            return (!key.contains('\\')).then_some(None);
        };
        if self.seen & 1 << field != 0 {
            return None;
        }
        self.seen |= 1 << field;
        Some(Some(field))
    }
}

/// Where a scan looks into a value (everything else is only checked and skipped).
pub(crate) enum Look {
    Nothing,
    /// An object's members; into those named, as said.
    Members(&'static [(&'static str, Look)]),
}

/// How [`review`] looks into `request.object`, as a Pod is read: its members, and those of
/// its `metadata` and `spec`.
const POD: Look = Look::Members(&[
    ("metadata", Look::Members(&[])),
    ("spec", Look::Members(&[])),
]);

impl<'a> Scanner<'a> {
    /// The value that starts here (after whitespace), checked, and looked into as `look` says.
    fn scan(&mut self, look: &Look) -> Option<Scanned<'a>> {
        let first = self.peek()?;
        let start = self.pos;
        let inner = match (look, first) {
            (Look::Members(named), b'{') => {
                // Enough for most of the objects looked into (a request has ~12 members).
                let mut members = Vec::with_capacity(16);
                self.object(|s, key| {
                    let below = named.iter().find(|(name, _)| *name == key);
                    members.push((key, s.scan(below.map_or(&Look::Nothing, |(_, l)| l))?));
                    Some(Step::Next)
                })?;
                Inner::Members(members)
            }
            _ => {
                self.value()?;
                Inner::Unread
            }
        };
        Some(Scanned {
            text: &self.text[start..self.pos],
            inner,
        })
    }
}

/// How [`review`] looks into an AdmissionReview: its members, its request's, and the object's
/// as a Pod is read ([`POD`]).
const REVIEW: Look = Look::Members(&[("request", Look::Members(&[("object", POD)]))]);

/// An AdmissionReview `body`, checked whole to be JSON in one pass which also notes where the
/// members of the review, of its request and of the object are (and those of the object's
/// `metadata` and `spec`), so that none is gone through again; `None` when the body is not
/// JSON this scanner accepts.
pub(crate) fn review(body: &str) -> Option<Scanned<'_>> {
    let mut scanner = Scanner::new(body);
    let review = scanner.scan(&REVIEW)?;
    scanner.end()?;
    Some(review)
}

#[cfg(test)]
pub(crate) mod tests;
