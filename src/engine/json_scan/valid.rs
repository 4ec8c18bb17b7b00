//! Whether a text is JSON, 64 bytes at a time, and [`ValidJson`]: text that has been shown to
//! be, which code may then walk without checking it again.
//!
//! What counts as JSON is what serde_json reads into `IgnoredAny` or a `&RawValue` (RFC 8259:
//! no trailing commas, no leading zeros, no control characters in strings, only the escapes
//! `\" \\ \/ \b \f \n \r \t \uXXXX`, any four hex digits — serde_json skips a lone surrogate
//! there), nested at most [`MAX_DEPTH`] levels. The validator never says yes to text serde_json
//! refuses; it may say no to text serde_json takes (deeper than [`MAX_DEPTH`]), and the caller
//! then reads the text with serde_json, whose answer counts.
//!
//! How: each block of 64 bytes is first classified into bitmasks (bit i: byte i is a quote,
//! a structural `{}[]:,`, whitespace, …; SSE2 on x86_64, byte by byte elsewhere). The escaped
//! bytes come from the runs of backslashes (an odd run escapes the byte after it), the bytes
//! inside strings from a prefix XOR of the unescaped quotes, carried from block to block. A
//! control byte inside a string, or outside one other than tab, newline and return, makes the
//! text invalid; so does a bad escape (each escape is looked at alone: they are rare). Then the
//! tokens — structurals outside strings, opening quotes, the first byte of each run of other
//! bytes outside strings (a number or `true`, `false`, `null`) — go through a small state
//! machine: a table from (state, byte) to the next state, the open objects and arrays kept as
//! bits of one word. A scalar is checked where it starts, and must end at whitespace, a
//! structural, a quote or the end.
//!
//! The API, for code that reads admissions: [`ValidJson::new`] is the only way to get checked
//! text (every other constructor takes a part of a `ValidJson`: a member's value from
//! [`ValidJson::members`], [`ValidJson::value_at`]); [`ValidJson::skip_value`] finds where a
//! value ends without checking anything, string- and bracket-aware.

use std::ops::Range;

use super::{literal, number_end, special_bytes};

mod classify;
mod trusted;

pub(crate) use trusted::{Member, Members};

/// Text that is one JSON value (whitespace around it allowed), as serde_json reads JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ValidJson<'a>(&'a str);

impl<'a> ValidJson<'a> {
    /// `text`, when it is JSON [`is_valid`] vouches for.
    pub(crate) fn new(text: &'a str) -> Option<Self> {
        is_valid(text.as_bytes()).then_some(Self(text))
    }

    pub(crate) fn text(&self) -> &'a str {
        self.0
    }
}

/// serde_json checked a `RawValue` is JSON when it read it (it may be deeper than
/// [`MAX_DEPTH`]: nothing that walks a `ValidJson` depends on the depth).
impl<'a> From<&'a serde_json::value::RawValue> for ValidJson<'a> {
    fn from(raw: &'a serde_json::value::RawValue) -> Self {
        Self(raw.get())
    }
}

/// The states of the grammar: what may come next. `ERROR` is where every wrong token leads.
const ERROR: u8 = 0;
const TOP_START: u8 = 1;
const TOP_END: u8 = 2;
/// After `{`: a key or `}`.
const OBJECT_START: u8 = 3;
/// After a `,` in an object: a key.
const OBJECT_KEY: u8 = 4;
/// After a key: `:`.
const OBJECT_COLON: u8 = 5;
/// After `:`: a value.
const OBJECT_VALUE: u8 = 6;
/// After a member's value: `,` or `}`.
const OBJECT_NEXT: u8 = 7;
/// After `[`: a value or `]`.
const ARRAY_START: u8 = 8;
/// After a `,` in an array: a value.
const ARRAY_VALUE: u8 = 9;
/// After an element: `,` or `]`.
const ARRAY_NEXT: u8 = 10;
const STATES: usize = 11;
/// Table entries from here on are actions, not states.
const OPEN_OBJECT: u8 = 16;
const OPEN_ARRAY: u8 = 17;
const CLOSE: u8 = 18;
const SCALAR: u8 = 19;

/// The state after a value, by the state that expected it.
const fn after_value(state: u8) -> u8 {
    match state {
        TOP_START => TOP_END,
        OBJECT_VALUE => OBJECT_NEXT,
        ARRAY_START | ARRAY_VALUE => ARRAY_NEXT,
        _ => ERROR,
    }
}

/// (state, token's first byte) → the next state or an action.
static TABLE: [[u8; 256]; STATES] = table();

const fn table() -> [[u8; 256]; STATES] {
    let mut table = [[ERROR; 256]; STATES];
    let expecting_value = [TOP_START, OBJECT_VALUE, ARRAY_START, ARRAY_VALUE];
    let mut i = 0;
    while i < expecting_value.len() {
        let row = &mut table[expecting_value[i] as usize];
        row[b'"' as usize] = after_value(expecting_value[i]);
        row[b'{' as usize] = OPEN_OBJECT;
        row[b'[' as usize] = OPEN_ARRAY;
        let scalar_starts = b"-0123456789tfn";
        let mut j = 0;
        while j < scalar_starts.len() {
            row[scalar_starts[j] as usize] = SCALAR;
            j += 1;
        }
        i += 1;
    }
    table[ARRAY_START as usize][b']' as usize] = CLOSE;
    table[OBJECT_START as usize][b'"' as usize] = OBJECT_COLON;
    table[OBJECT_START as usize][b'}' as usize] = CLOSE;
    table[OBJECT_KEY as usize][b'"' as usize] = OBJECT_COLON;
    table[OBJECT_COLON as usize][b':' as usize] = OBJECT_VALUE;
    table[OBJECT_NEXT as usize][b',' as usize] = OBJECT_KEY;
    table[OBJECT_NEXT as usize][b'}' as usize] = CLOSE;
    table[ARRAY_NEXT as usize][b',' as usize] = ARRAY_VALUE;
    table[ARRAY_NEXT as usize][b']' as usize] = CLOSE;
    table
}

/// Bits at even positions.
const EVEN: u64 = 0x5555_5555_5555_5555;

/// Whether `bytes` is one JSON value, nested at most [`MAX_DEPTH`] levels (see the module doc).
pub(crate) fn is_valid(bytes: &[u8]) -> bool {
    let mut validator = Validator {
        bytes,
        inside: 0,
        escape_next: 0,
        scalar_last: 0,
        state: TOP_START,
        open: 1,
    };
    let mut blocks = bytes.chunks_exact(64);
    let mut base = 0;
    for block in &mut blocks {
        if validator
            .block(block.try_into().expect("64 bytes"), base)
            .is_none()
        {
            return false;
        }
        base += 64;
    }
    let rest = blocks.remainder();
    if !rest.is_empty() {
        // The tail, padded with spaces: no load past the text's end.
        let mut padded = [b' '; 64];
        padded[..rest.len()].copy_from_slice(rest);
        if validator.block(&padded, base).is_none() {
            return false;
        }
    }
    validator.state == TOP_END && validator.inside == 0
}

/// What one block hands the next, and the grammar's state.
struct Validator<'a> {
    bytes: &'a [u8],
    /// All ones when the next block starts inside a string.
    inside: u64,
    /// 1 when the next block's first byte is escaped.
    escape_next: u64,
    /// 1 when the last block ended in a scalar's bytes.
    scalar_last: u64,
    state: u8,
    /// The open containers below the innermost, innermost lowest: 1 for an object. Above
    /// them a 1, the sentinel: `open == 1` in the outermost container, and a push with the
    /// sentinel at bit 63 would be the 65th level.
    open: u64,
}

impl Validator<'_> {
    /// Checks the block at `base` (its bytes, padded if it is the tail); `None` when the text
    /// is not valid.
    #[inline(always)]
    fn block(&mut self, block: &[u8; 64], base: usize) -> Option<()> {
        let classes = classify::block(block);
        let (backslash, control) = if classes.rare {
            classify::rare(block)
        } else {
            (0, 0)
        };
        let escaped = if backslash | self.escape_next == 0 {
            0
        } else {
            self.escapes(backslash, base)?
        };
        let quotes = classes.quote & !escaped;
        let inside = prefix_xor(quotes) ^ self.inside;
        self.inside = ((inside as i64) >> 63) as u64;
        if control != 0 {
            self.controls(control, inside, base)?;
        }
        let scalar = !(classes.not_scalar | control | inside);
        let scalar_starts = scalar & !(scalar << 1 | self.scalar_last);
        self.scalar_last = scalar >> 63;
        let tokens = (classes.structural & !inside) | (quotes & inside) | scalar_starts;
        self.tokens(tokens, block, base)
    }

    /// The escaped bytes of the block at `base` whose backslashes are `backslash`, each escape
    /// checked. A run of backslashes escapes the byte after it when its length is odd: adding
    /// a run's first bit to the run carries to the bit just past it, and the parity of the
    /// start and of that end tells the length's.
    fn escapes(&mut self, backslash: u64, base: usize) -> Option<u64> {
        let first = self.escape_next;
        let runs = backslash & !first;
        let starts = runs & !(runs << 1);
        let past_even = runs.wrapping_add(starts & EVEN) & !runs;
        let (odd, carry) = runs.overflowing_add(starts & !EVEN);
        let past_odd = odd & !runs;
        self.escape_next = u64::from(carry);
        let escaped = (past_even & !EVEN) | (past_odd & EVEN) | first;
        let mut check = escaped;
        while check != 0 {
            let at = base + check.trailing_zeros() as usize;
            check &= check - 1;
            escape(self.bytes, at)?;
        }
        Some(escaped)
    }

    /// Control bytes: none inside a string, and only tab, newline and return outside one.
    fn controls(&self, control: u64, inside: u64, base: usize) -> Option<()> {
        if control & inside != 0 {
            return None;
        }
        let mut outside = control;
        while outside != 0 {
            let at = base + outside.trailing_zeros() as usize;
            outside &= outside - 1;
            // The padding is spaces, so `at` is in the text.
            if !matches!(self.bytes[at], b'\t' | b'\n' | b'\r') {
                return None;
            }
        }
        Some(())
    }

    /// The grammar over the block's tokens.
    #[inline(always)]
    fn tokens(&mut self, mut tokens: u64, block: &[u8; 64], base: usize) -> Option<()> {
        let mut state = self.state;
        while tokens != 0 {
            let at = tokens.trailing_zeros() as usize;
            tokens &= tokens - 1;
            let next = TABLE[usize::from(state)][usize::from(block[at & 63])];
            if next < OPEN_OBJECT {
                state = next;
                continue;
            }
            state = self.action(next, state, base + at)?;
        }
        self.state = state;
        (state != ERROR).then_some(())
    }

    /// What a table's action does in `state` at `at`: the state after it.
    fn action(&mut self, action: u8, state: u8, at: usize) -> Option<u8> {
        match action {
            OPEN_OBJECT | OPEN_ARRAY => {
                if state != TOP_START {
                    if self.open >> 63 != 0 {
                        return None;
                    }
                    self.open = self.open << 1 | u64::from(state == OBJECT_VALUE);
                }
                Some(if action == OPEN_OBJECT {
                    OBJECT_START
                } else {
                    ARRAY_START
                })
            }
            CLOSE if self.open == 1 => Some(TOP_END),
            CLOSE => {
                let object = self.open & 1 == 1;
                self.open >>= 1;
                Some(if object { OBJECT_NEXT } else { ARRAY_NEXT })
            }
            _ => {
                let end = match self.bytes[at] {
                    b't' => literal(self.bytes, at, b"true"),
                    b'f' => literal(self.bytes, at, b"false"),
                    b'n' => literal(self.bytes, at, b"null"),
                    _ => number_end(self.bytes, at),
                }?;
                let ends_well = matches!(
                    self.bytes.get(end),
                    None | Some(b' ' | b'\t' | b'\n' | b'\r' | b',' | b':' | b'"')
                        | Some(b'{' | b'}' | b'[' | b']')
                );
                ends_well.then_some(after_value(state))
            }
        }
    }
}

/// The escape whose backslash is just before `at`: one serde_json takes.
fn escape(bytes: &[u8], at: usize) -> Option<()> {
    match *bytes.get(at)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(()),
        b'u' => bytes
            .get(at + 1..at + 5)?
            .iter()
            .all(u8::is_ascii_hexdigit)
            .then_some(()),
        _ => None,
    }
}

/// Bit i: the XOR of bits 0..=i of `x` (from a quote up to before the next: inside a string).
#[inline(always)]
fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    x
}

impl<'a> ValidJson<'a> {
    /// The value starting at `at` as checked text of its own. `at` must be where a value
    /// starts (a member's value, an element); in debug builds that is checked.
    #[cfg(test)]
    pub(crate) fn value_at(&self, at: usize) -> ValidJson<'a> {
        let value = Self(&self.0[at..self.skip_value(at)]);
        debug_assert!(is_valid(value.0.as_bytes()), "not a value at {at}");
        value
    }

    /// Where `range` is in the text: used by [`ValidJson::members`] to say where a member is.
    fn span(&self, range: Range<usize>) -> ValidJson<'a> {
        Self(&self.0[range])
    }
}

#[cfg(test)]
mod tests;
