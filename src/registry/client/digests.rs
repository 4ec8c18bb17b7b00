//! Digests: checking a body against the digest it was asked by or the registry named, and
//! showing a digest or reference in a message only when it looks like one.

use crate::registry::FetchError;

/// `sha256:<64 hex>` or `sha512:<128 hex>`: a digest a manifest can be fetched and checked by.
pub(crate) fn is_digest(text: &str) -> bool {
    let hex_of = |hex: &str, len: usize| {
        hex.len() == len && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    match text.split_once(':') {
        Some(("sha256", hex)) => hex_of(hex, 64),
        Some(("sha512", hex)) => hex_of(hex, 128),
        _ => false,
    }
}

pub(crate) fn sha256_digest(body: &[u8]) -> String {
    hex_digest(
        "sha256",
        ring::digest::digest(&ring::digest::SHA256, body).as_ref(),
    )
}

pub(super) fn hex_digest(algorithm: &str, bytes: &[u8]) -> String {
    let mut out = String::with_capacity(algorithm.len() + 1 + bytes.len() * 2);
    out.push_str(algorithm);
    out.push(':');
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Checks `body` against `expected` (`sha256:…` or `sha512:…`).
pub(super) fn verify_digest(expected: &str, body: &[u8]) -> Result<(), FetchError> {
    let actual = match expected.split_once(':') {
        Some(("sha256", _)) => sha256_digest(body),
        Some(("sha512", _)) => hex_digest(
            "sha512",
            ring::digest::digest(&ring::digest::SHA512, body).as_ref(),
        ),
        _ => {
            return Err(FetchError::Malformed(format!(
                "unsupported digest {}",
                shown_digest(expected)
            )))
        }
    };
    if actual == expected {
        Ok(())
    } else {
        Err(FetchError::Malformed(format!(
            "content does not match its digest (expected {}, got {actual})",
            shown_digest(expected)
        )))
    }
}

/// A digest as a message may repeat it (`algorithm:hex`, short): `expected` may come from a
/// response header, and a header's free text must not reach a warning.
fn shown_digest(digest: &str) -> &str {
    let plausible = digest.len() <= 160
        && digest.split_once(':').is_some_and(|(algorithm, hex)| {
            !algorithm.is_empty()
                && algorithm.bytes().all(|b| b.is_ascii_alphanumeric())
                && !hex.is_empty()
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
        });
    if plausible {
        digest
    } else {
        "(unrecognised)"
    }
}

/// A manifest reference or blob digest as a message may repeat it: a digest as
/// [`shown_digest`] shows it, a tag as it is (the reference parser checked it; anything else
/// is unrecognised).
pub(super) fn shown_reference(reference: &str) -> &str {
    let tag = (1..=128).contains(&reference.len())
        && reference
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    match reference.contains(':') {
        true => shown_digest(reference),
        false if tag => reference,
        false => "(unrecognised)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests() {
        let d = sha256_digest(b"hello");
        assert_eq!(
            d,
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        verify_digest(&d, b"hello").unwrap();
        assert!(verify_digest(&d, b"hellO").is_err());
        assert!(verify_digest("md5:abc", b"hello").is_err());
        let err = verify_digest("sha256:SECRET text", b"hello").unwrap_err();
        assert!(!format!("{err:?}").contains("SECRET"), "{err:?}");
        let err = verify_digest("SECRET", b"hello").unwrap_err();
        assert!(!format!("{err:?}").contains("SECRET"), "{err:?}");
        let sha512 = hex_digest(
            "sha512",
            ring::digest::digest(&ring::digest::SHA512, b"x").as_ref(),
        );
        verify_digest(&sha512, b"x").unwrap();
    }

    #[test]
    fn only_real_digests_are_taken_from_a_head() {
        assert!(is_digest(&sha256_digest(b"x")));
        let sha512 = hex_digest(
            "sha512",
            ring::digest::digest(&ring::digest::SHA512, b"x").as_ref(),
        );
        assert!(is_digest(&sha512));
        for bad in [
            "",
            "sha256:",
            "sha256:abc",
            "md5:d41d8cd98f00b204e9800998ecf8427e",
            &format!("sha256:{}", "A".repeat(64)),
            &format!("sha256:{}/../x", "a".repeat(64)),
        ] {
            assert!(!is_digest(bad), "{bad}");
        }
    }
}
