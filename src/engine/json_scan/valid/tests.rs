use super::*;

use crate::engine::json_scan::tests::corpus;
use crate::engine::json_scan::{Scanner, MAX_DEPTH};

/// Whether serde_json skips `text` as one JSON value (what a `RawValue` and `IgnoredAny` read).
fn serde_skips(text: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// How deeply `text` nests, counting brackets outside strings (good enough for JSON text).
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
    for byte in text.bytes() {
        match (in_string, byte) {
            (true, _) if escaped => escaped = false,
            (true, b'\\') => escaped = true,
            (_, b'"') => in_string = !in_string,
            (false, b'{' | b'[') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, b'}' | b']') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The validator's rule: it never takes what serde_json refuses, and takes all serde_json
/// takes unless it nests deeper than `MAX_DEPTH`. Answers whether it took `text`.
fn agrees(text: &str) -> bool {
    let valid = is_valid(text.as_bytes());
    let serde = serde_skips(text);
    assert!(!valid || serde, "the validator took {text:?}");
    assert!(
        valid || !serde || nesting(text) > MAX_DEPTH as usize,
        "the validator refused {text:?}"
    );
    valid
}

/// The recorded v1.36 Pod admission, compact as an API server sends it.
fn recorded_compact() -> String {
    let body = include_str!(
        "../../../../tests/data/admissionreview/v1.36/pod-create-replicaset-shaped.json"
    );
    serde_json::to_string(&serde_json::from_str::<serde_json::Value>(body).unwrap()).unwrap()
}

/// Every file of the test data and the fuzz corpus, compact too, and every prefix of the small
/// ones and of the compact recorded body.
#[test]
fn the_validator_agrees_with_serde_json_on_the_test_data_and_its_prefixes() {
    let mut texts = corpus();
    let compact: Vec<String> = texts
        .iter()
        .filter_map(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .map(|v| serde_json::to_string(&v).unwrap())
        .collect();
    texts.extend(compact);
    let recorded = recorded_compact();
    assert!(agrees(&recorded), "the recorded body is taken");
    let mut taken = 0;
    for text in texts.iter().chain([&recorded]) {
        taken += usize::from(agrees(text));
        if text.len() <= 4096 || *text == recorded {
            for end in (0..text.len()).filter(|&end| text.is_char_boundary(end)) {
                agrees(&text[..end]);
            }
        }
    }
    assert!(taken > 300, "{taken} taken");
}

/// Bytes JSON gives meaning to, or that it refuses.
const INTERESTING: &[u8] = b"\"\\{}[]:, \t\n\r\x00\x01\x1f\x7f0129-+.eEtfnu/bx";

/// Each byte of the small AdmissionReviews replaced by, and preceded by, each interesting byte
/// (and by the first byte of a two-byte UTF-8 character); each position of the compact
/// recorded body by one of them in turn.
#[test]
fn the_validator_agrees_with_serde_json_on_one_byte_mutations() {
    let mutate = |text: &str, at: usize, byte: u8, insert: bool| {
        let mut bytes = text.as_bytes().to_vec();
        if insert {
            bytes.insert(at, byte);
        } else {
            bytes[at] = byte;
        }
        String::from_utf8(bytes).ok()
    };
    let (mut checked, mut taken) = (0, 0);
    let small = corpus()
        .into_iter()
        .filter(|t| t.len() < 1300 && t.contains("Admission"));
    for text in small {
        for at in 0..text.len() {
            for &byte in INTERESTING.iter().chain(&[0xc3]) {
                for insert in [false, true] {
                    if let Some(mutated) = mutate(&text, at, byte, insert) {
                        taken += usize::from(agrees(&mutated));
                        checked += 1;
                    }
                }
            }
        }
    }
    let recorded = recorded_compact();
    for at in 0..recorded.len() {
        let byte = INTERESTING[at % INTERESTING.len()];
        if let Some(mutated) = mutate(&recorded, at, byte, at % 2 == 0) {
            taken += usize::from(agrees(&mutated));
            checked += 1;
        }
    }
    assert!(checked > 50_000 && taken > 1000, "{taken} of {checked}");
}

/// Pieces that straddle the blocks' edges when shifted byte by byte: backslash runs of every
/// length up to 9 before a quote or a letter, escapes, numbers, literals, empty containers.
const PIECES: &[&str] = &[
    r#""\"""#,
    r#""\\""#,
    r#""\\\"""#,
    r#""\\\\""#,
    r#""\\\\\"\\""#,
    r#""\\\\\\\\\"""#,
    r#""\\\\\\\\\\""#,
    r#""\\\\\\\\\x""#,
    r#""\\\x""#,
    r#""\u00e9\u00E9""#,
    r#""\ud800""#,
    r#""\u00g9""#,
    r#""\u00""#,
    r#""\/\b\f\n\r\t""#,
    "\"a\u{1}b\"",
    "\"tab\there\"",
    "\"é漢字\"",
    "-12.5e+3",
    "0",
    "01",
    "1.",
    "-",
    "true",
    "tru",
    "truex",
    "null",
    "false",
    "{}",
    "[]",
    "{\"a\":1}",
    "{\"a\"}",
    "{\"a\":1,}",
    "[1,]",
    "[1 2]",
    "\"a\"\"b\"",
    "{\"a\" : [ true , null ] }",
    "\\",
    "x",
];

/// Every piece at every offset 0..200 into the text, after spaces and after a long string,
/// so each of its bytes lands on each position of a 16- and 64-byte block.
#[test]
fn the_validator_agrees_with_serde_json_across_block_edges() {
    let mut taken = 0;
    for piece in PIECES {
        for pad in 0..200 {
            let spaced = format!("[{}{piece}]", " ".repeat(pad));
            let stringed = format!("[\"{}\",{piece},0]", "a".repeat(pad));
            let escaped = format!("[\"{}\",{piece}]", "\\\\".repeat(pad / 2));
            let last = format!("{}{piece}", " ".repeat(pad));
            for text in [spaced, stringed, escaped, last] {
                taken += usize::from(agrees(&text));
            }
        }
    }
    assert!(taken > 10_000, "{taken}");
}

/// Long runs of backslashes, odd and even, before a quote, in one string and across blocks.
#[test]
fn long_backslash_runs_escape_by_their_parity() {
    for run in 0..300 {
        for lead in [0, 1, 31, 62, 63] {
            let text = format!("\"{}{}\"", "a".repeat(lead), "\\".repeat(run));
            assert_eq!(agrees(&text), run % 2 == 0, "{run} after {lead}");
            let quoted = format!("[\"{}{}\"x\"]", "a".repeat(lead), "\\".repeat(run));
            assert_eq!(
                agrees(&quoted),
                run % 2 == 1,
                "{run} after {lead}, then a quote"
            );
        }
    }
}

/// Objects and arrays nest up to `MAX_DEPTH` levels: one more, and the validator refuses what
/// serde_json takes (its caller then reads with serde_json).
#[test]
fn nesting_is_taken_up_to_max_depth() {
    let arrays = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
    let objects = |levels: usize| format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels));
    let mixed = |levels: usize| {
        let open: String = (0..levels)
            .map(|i| if i % 2 == 0 { "[" } else { "{\"k\":" })
            .collect();
        let close: String = (0..levels)
            .rev()
            .map(|i| if i % 2 == 0 { "]" } else { "}" })
            .collect();
        format!("{open}null{close}")
    };
    let max = MAX_DEPTH as usize;
    for nest in [arrays, objects, mixed] {
        for levels in [1, max - 1, max] {
            assert!(agrees(&nest(levels)), "{levels}");
        }
        assert!(!is_valid(nest(max + 1).as_bytes()) && serde_skips(&nest(max + 1)));
        let wrong = nest(max)
            .replacen('1', "1]", 1)
            .replacen("null", "null}", 1);
        assert!(!is_valid(wrong.as_bytes()));
    }
    assert!(agrees("[[[]],[{}],{\"a\":[]}]") && !agrees("[[]]]") && !agrees("[{]}"));
}

/// The SSE2 classifier and the byte-by-byte one (used where there is no SSE2) classify alike:
/// every block of the test data, and blocks of every byte value.
#[test]
fn the_classifiers_agree() {
    let mut blocks: Vec<[u8; 64]> = corpus()
        .iter()
        .flat_map(|t| {
            t.as_bytes()
                .chunks_exact(64)
                .map(|c| c.try_into().unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    blocks.extend((0..4).map(|q| std::array::from_fn(|i| (q * 64 + i) as u8)));
    for block in &blocks {
        assert_eq!(classify::block(block), classify::portable::block(block));
        assert_eq!(classify::rare(block), classify::portable::rare(block));
    }
}

/// The trusted walk finds what the checking scanner finds: each member's key and value of
/// every object in the test data, at every level.
#[test]
fn the_trusted_walk_finds_what_the_scanner_finds() {
    fn walk(json: ValidJson, visited: &mut usize) {
        let Some(members) = json.members() else {
            return;
        };
        let mut scanner = Scanner::new(json.text());
        let mut scanned = Vec::new();
        scanner
            .object(|s, key| {
                let value = s.value()?;
                scanned.push((key, s.text(value)));
                Some(super::super::Step::Next)
            })
            .expect("the scanner reads the object");
        let walked: Vec<_> = members.map(|m| (m.key, m.value)).collect();
        assert_eq!(walked.len(), scanned.len());
        for ((key, value), (scanned_key, scanned_value)) in walked.into_iter().zip(scanned) {
            assert_eq!((key, value.text()), (scanned_key, scanned_value));
            *visited += 1;
            walk(value, visited);
        }
    }
    let mut visited = 0;
    for text in corpus().iter().filter(|t| nesting(t) < 30) {
        if let Some(json) = ValidJson::new(text) {
            walk(json, &mut visited);
        }
    }
    assert!(visited > 2000, "{visited}");
    let json = ValidJson::new(r#" [ "a\"]" , {"b" : [1, "}"]} , 2.5e3 ] "#).unwrap();
    assert_eq!(json.skip_value(1), 38);
    assert_eq!(json.skip_value(3), 9);
    assert_eq!(json.value_at(12).text(), r#"{"b" : [1, "}"]}"#);
    assert_eq!(json.value_at(31).text(), "2.5e3");
}
