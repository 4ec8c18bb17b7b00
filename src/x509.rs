//! The two things tolerable reads from an X.509 certificate itself: when it expires
//! (`notAfter`), for the expiry metrics, and the IP addresses it is for (its `iPAddress`
//! subject alternative names), for the reload's name check. rustls and webpki check
//! certificates but expose neither, so the DER is walked here: `Certificate ::= SEQUENCE {
//! tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer, validity
//! SEQUENCE { notBefore, notAfter }, subject, subjectPublicKeyInfo, [1] issuerUniqueID
//! OPTIONAL, [2] subjectUniqueID OPTIONAL, [3] extensions OPTIONAL } … }` (RFC 5280, section
//! 4.1).

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::CertificateDer;

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const OID: u8 = 0x06;
const BOOLEAN: u8 = 0x01;
const OCTET_STRING: u8 = 0x04;
const VERSION: u8 = 0xA0;
const EXTENSIONS: u8 = 0xA3;
/// `GeneralName`'s `[7] IMPLICIT OCTET STRING`: 4 bytes (IPv4) or 16 (IPv6).
const IP_ADDRESS: u8 = 0x87;
/// The contents of the OID 2.5.29.17, subjectAltName.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// One DER element at the start of `input`: its tag, its contents and what follows it.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, rest) = rest.split_at(count);
        let length = bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b));
        (length, rest)
    };
    (rest.len() >= length).then(|| {
        let (contents, rest) = rest.split_at(length);
        (tag, contents, rest)
    })
}

/// The element at the start of `input`, which must have `tag`: its contents and what follows.
fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (found, contents, rest) = element(input)?;
    (found == tag).then_some((contents, rest))
}

/// The tbsCertificate's fields from `validity` on.
fn from_validity(der: &[u8]) -> Option<&[u8]> {
    let (certificate, _) = expect(der, SEQUENCE)?;
    let (tbs, _) = expect(certificate, SEQUENCE)?;
    let mut rest = tbs;
    if rest.first() == Some(&VERSION) {
        rest = element(rest)?.2;
    }
    let (_, rest) = expect(rest, INTEGER)?; // serialNumber
    let (_, rest) = expect(rest, SEQUENCE)?; // signature
    let (_, rest) = expect(rest, SEQUENCE)?; // issuer
    Some(rest)
}

/// `notAfter` of a DER certificate, in seconds since the Unix epoch.
pub(crate) fn not_after(der: &[u8]) -> Option<i64> {
    let (validity, _) = expect(from_validity(der)?, SEQUENCE)?;
    let (_, _, after_not_before) = element(validity)?;
    let (tag, time, _) = element(after_not_before)?;
    parse_time(tag, time)
}

/// The IP addresses among a DER certificate's subject alternative names (none when it has no
/// such extension, or cannot be read).
pub(crate) fn ip_addresses(der: &[u8]) -> Vec<std::net::IpAddr> {
    subject_alt_names(der)
        .map(|names| {
            let mut found = Vec::new();
            let mut rest = names;
            while let Some((tag, contents, next)) = element(rest) {
                match (
                    tag,
                    <[u8; 4]>::try_from(contents),
                    <[u8; 16]>::try_from(contents),
                ) {
                    (IP_ADDRESS, Ok(v4), _) => found.push(v4.into()),
                    (IP_ADDRESS, _, Ok(v6)) => found.push(v6.into()),
                    _ => {}
                }
                rest = next;
            }
            found
        })
        .unwrap_or_default()
}

/// The contents of the subjectAltName extension's `GeneralNames` sequence.
fn subject_alt_names(der: &[u8]) -> Option<&[u8]> {
    let (_, rest) = expect(from_validity(der)?, SEQUENCE)?; // validity
    let (_, rest) = expect(rest, SEQUENCE)?; // subject
    let (_, mut rest) = expect(rest, SEQUENCE)?; // subjectPublicKeyInfo
    let extensions = loop {
        let (tag, contents, next) = element(rest)?;
        if tag == EXTENSIONS {
            break contents;
        }
        rest = next; // the unique IDs
    };
    let (mut extensions, _) = expect(extensions, SEQUENCE)?;
    while let Some((extension, next)) = expect(extensions, SEQUENCE) {
        let (oid, mut value) = expect(extension, OID)?;
        if oid == SUBJECT_ALT_NAME {
            if value.first() == Some(&BOOLEAN) {
                value = element(value)?.2; // critical
            }
            let (names, _) = expect(value, OCTET_STRING)?;
            return Some(expect(names, SEQUENCE)?.0);
        }
        extensions = next;
    }
    None
}

/// The earliest `notAfter` of the certificates in a PEM bundle; `None` when it holds none.
pub(crate) fn earliest_not_after(pem: &[u8]) -> Option<i64> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .filter_map(|cert| not_after(&cert))
        .min()
}

/// An X.509 time (UTCTime `YYMMDDHHMMSSZ`, years 1950–2049, or GeneralizedTime
/// `YYYYMMDDHHMMSSZ`) in seconds since the Unix epoch.
fn parse_time(tag: u8, text: &[u8]) -> Option<i64> {
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0i64, |n, &d| n * 10 + i64::from(d - b'0')))
    };
    let (year, rest) = match (tag, text.len()) {
        (UTC_TIME, 13) => {
            let yy = digits(0..2)?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
        }
        (GENERALIZED_TIME, 15) => (digits(0..4)?, 4),
        _ => return None,
    };
    if text.last() != Some(&b'Z') {
        return None;
    }
    let field = |i: usize| digits(rest + 2 * i..rest + 2 * i + 2);
    let (month, day) = (field(0)?, field(1)?);
    let (hour, minute, second) = (field(2)?, field(3)?, field(4)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days from 1970-01-01 to the given date of the proleptic Gregorian calendar (the well-known
/// era-based conversion: eras of 400 years, March-based years so the leap day comes last).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A self-signed certificate valid until the start of day `ymd` plus `seconds` (rcgen's
    /// default, 4096-01-01, without `ymd`).
    fn certificate(ymd: Option<(i32, u8, u8)>, seconds: u64) -> String {
        let mut params = rcgen::CertificateParams::new(vec!["tolerable.test".to_owned()]).unwrap();
        if let Some((year, month, day)) = ymd {
            params.not_after =
                rcgen::date_time_ymd(year, month, day) + Duration::from_secs(seconds);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn reads_not_after_in_both_time_encodings() {
        // UTCTime up to 2049, GeneralizedTime from 2050 on (RFC 5280); rcgen's default is 4096.
        for (ymd, seconds, expected) in [
            (Some((2031, 5, 17)), 0, 1_936_742_400),
            (Some((2049, 12, 31)), 86_399, 2_524_607_999),
            (Some((2050, 1, 1)), 0, 2_524_608_000),
            (None, 0, 67_090_118_400),
        ] {
            let pem = certificate(ymd, seconds);
            assert_eq!(
                earliest_not_after(pem.as_bytes()),
                Some(expected),
                "{ymd:?} + {seconds}s"
            );
        }
    }

    #[test]
    fn a_bundle_gives_its_earliest_expiry() {
        let bundle = [
            certificate(Some((2040, 1, 1)), 0),
            certificate(Some((2031, 5, 17)), 0),
            certificate(None, 0),
        ]
        .concat();
        assert_eq!(earliest_not_after(bundle.as_bytes()), Some(1_936_742_400));
        assert_eq!(earliest_not_after(b"not a certificate"), None);
    }

    #[test]
    fn times_are_read_exactly_and_bad_ones_refused() {
        assert_eq!(parse_time(UTC_TIME, b"990228123045Z"), Some(920_205_045));
        assert_eq!(parse_time(UTC_TIME, b"700101000000Z"), Some(0));
        assert_eq!(
            parse_time(GENERALIZED_TIME, b"20000229000000Z"),
            Some(951_782_400)
        );
        for (tag, bad) in [
            (UTC_TIME, &b"990228123045"[..]),
            (UTC_TIME, b"99022812304Z"),
            (UTC_TIME, b"991328123045Z"),
            (GENERALIZED_TIME, b"990228123045Z"),
            (INTEGER, b"990228123045Z"),
            (UTC_TIME, b"99O228123045Z"),
        ] {
            assert_eq!(
                parse_time(tag, bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn reads_the_ip_address_names_and_nothing_else() {
        let params = rcgen::CertificateParams::new(
            ["tolerable.test", "127.0.0.1", "::1", "10.1.2.3"].map(String::from),
        )
        .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let der = params.self_signed(&key).unwrap().der().to_vec();
        let expected: Vec<std::net::IpAddr> = ["127.0.0.1", "::1", "10.1.2.3"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(ip_addresses(&der), expected);
        let pem = certificate(None, 0);
        let dns_only = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        assert!(ip_addresses(&dns_only).is_empty());
        for cut in [0, 10, der.len() / 2, der.len() - 1] {
            assert!(ip_addresses(&der[..cut]).is_empty(), "cut at {cut}");
        }
    }

    #[test]
    fn truncated_or_foreign_der_gives_nothing() {
        let pem = certificate(None, 0);
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        for cut in [0, 1, 2, 10, 40, der.len() / 2] {
            assert_eq!(not_after(&der[..cut]), None, "cut at {cut}");
        }
        assert_eq!(not_after(&[0x02, 0x01, 0x05]), None);
        assert_eq!(not_after(&[0x30, 0x85, 0, 0, 0, 0, 0]), None);
    }
}
