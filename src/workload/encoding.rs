//! Text as kubectl reads it: UTF-8, or UTF-16 / UTF-32 announced by a byte order mark
//! (PowerShell's `>` writes UTF-16 LE), turned into UTF-8 as it is read, a block at a time.

use std::io::{self, BufRead, BufReader, Cursor, Read};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    Utf16Le,
    Utf16Be,
    Utf32Le,
    Utf32Be,
}

impl Encoding {
    /// The encoding a byte order mark at the start of `head` announces, and the mark's length.
    fn announced(head: &[u8]) -> Option<(Self, usize)> {
        match head {
            [0xFF, 0xFE, 0, 0, ..] => Some((Self::Utf32Le, 4)),
            [0, 0, 0xFE, 0xFF, ..] => Some((Self::Utf32Be, 4)),
            [0xFF, 0xFE, ..] => Some((Self::Utf16Le, 2)),
            [0xFE, 0xFF, ..] => Some((Self::Utf16Be, 2)),
            _ => None,
        }
    }

    fn unit(self) -> usize {
        match self {
            Self::Utf16Le | Self::Utf16Be => 2,
            Self::Utf32Le | Self::Utf32Be => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Utf16Le | Self::Utf16Be => "UTF-16",
            Self::Utf32Le | Self::Utf32Be => "UTF-32",
        }
    }
}

/// `reader` as UTF-8: unchanged unless it starts with a UTF-16 or UTF-32 byte order mark.
pub(crate) fn decoded(mut reader: Box<dyn BufRead>) -> io::Result<Box<dyn BufRead>> {
    let mut head = [0u8; 4];
    let mut n = 0;
    while n < head.len() {
        match reader.read(&mut head[n..])? {
            0 => break,
            k => n += k,
        }
    }
    let head = head[..n].to_vec();
    let Some((encoding, mark)) = Encoding::announced(&head) else {
        return Ok(Box::new(Cursor::new(head).chain(reader)));
    };
    let rest = Cursor::new(head[mark..].to_vec()).chain(reader);
    Ok(Box::new(BufReader::new(Transcoded {
        inner: rest,
        encoding,
        raw: Vec::new(),
        out: Vec::new(),
        at: 0,
    })))
}

/// A reader of UTF-16 or UTF-32 code units that gives UTF-8.
struct Transcoded<R> {
    inner: R,
    encoding: Encoding,
    /// Bytes read and not decoded yet (a unit or a surrogate pair cut by a block's end).
    raw: Vec<u8>,
    out: Vec<u8>,
    at: usize,
}

impl<R: Read> Transcoded<R> {
    /// Decodes the next block; false at the end.
    fn fill(&mut self) -> io::Result<bool> {
        let mut block = [0u8; 16 * 1024];
        let n = self.inner.read(&mut block)?;
        self.raw.extend_from_slice(&block[..n]);
        let end = n == 0;
        if end && self.raw.is_empty() {
            return Ok(false);
        }
        let bad = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not {} text: {why}", self.encoding.name()),
            )
        };
        let whole = self.raw.len() - self.raw.len() % self.encoding.unit();
        if end && whole != self.raw.len() {
            return Err(bad("it ends within a character"));
        }
        let units = &self.raw[..whole];
        let mut text = String::with_capacity(units.len());
        let used = match self.encoding {
            Encoding::Utf16Le | Encoding::Utf16Be => {
                let le = self.encoding == Encoding::Utf16Le;
                let mut codes: Vec<u16> = units
                    .chunks_exact(2)
                    .map(|c| {
                        if le {
                            u16::from_le_bytes([c[0], c[1]])
                        } else {
                            u16::from_be_bytes([c[0], c[1]])
                        }
                    })
                    .collect();
                // A high surrogate at a block's end waits for its pair.
                let held = !end && codes.last().is_some_and(|c| (0xD800..0xDC00).contains(c));
                if held {
                    codes.pop();
                }
                for c in char::decode_utf16(codes.iter().copied()) {
                    text.push(c.map_err(|_| bad("an unpaired surrogate"))?);
                }
                codes.len() * 2
            }
            Encoding::Utf32Le | Encoding::Utf32Be => {
                let le = self.encoding == Encoding::Utf32Le;
                for c in units.chunks_exact(4) {
                    let code = [c[0], c[1], c[2], c[3]];
                    let code = if le {
                        u32::from_le_bytes(code)
                    } else {
                        u32::from_be_bytes(code)
                    };
                    text.push(
                        char::from_u32(code).ok_or_else(|| bad("a value that is no character"))?,
                    );
                }
                whole
            }
        };
        self.raw.drain(..used);
        self.out = text.into_bytes();
        self.at = 0;
        Ok(true)
    }
}

impl<R: Read> Read for Transcoded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.out.len() {
            if !self.fill()? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.out.len() - self.at);
        buf[..n].copy_from_slice(&self.out[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: Vec<u8>) -> io::Result<String> {
        let mut text = String::new();
        decoded(Box::new(Cursor::new(bytes)))?.read_to_string(&mut text)?;
        Ok(text)
    }

    fn utf16(text: &str, le: bool) -> Vec<u8> {
        let mut bytes = if le {
            vec![0xFF, 0xFE]
        } else {
            vec![0xFE, 0xFF]
        };
        for unit in text.encode_utf16() {
            bytes.extend(if le {
                unit.to_le_bytes()
            } else {
                unit.to_be_bytes()
            });
        }
        bytes
    }

    #[test]
    fn utf16_and_utf32_with_a_byte_order_mark_are_read_as_utf8() {
        // Long enough to cut a surrogate pair at a block's end somewhere.
        let text = "kind: Pod # 🐳\n".repeat(3000);
        assert_eq!(read(utf16(&text, true)).unwrap(), text);
        assert_eq!(read(utf16(&text, false)).unwrap(), text);
        let mut utf32 = vec![0xFF, 0xFE, 0, 0];
        for c in text.chars() {
            utf32.extend((c as u32).to_le_bytes());
        }
        assert_eq!(read(utf32).unwrap(), text);
        assert_eq!(read(b"kind: Pod\n".to_vec()).unwrap(), "kind: Pod\n");
        assert_eq!(read(b"a".to_vec()).unwrap(), "a");
    }

    #[test]
    fn broken_utf16_is_an_error_that_names_it() {
        let mut bytes = utf16("kind", true);
        bytes.extend([0x00, 0xD8, b'a', 0]);
        let err = read(bytes).unwrap_err().to_string();
        assert!(
            err.contains("not UTF-16 text: an unpaired surrogate"),
            "{err}"
        );
        let mut odd = utf16("kind", true);
        odd.push(b'a');
        assert!(read(odd)
            .unwrap_err()
            .to_string()
            .contains("ends within a character"));
    }
}
