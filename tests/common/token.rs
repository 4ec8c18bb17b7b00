//! A small registry token service (the distribution "token" auth flow), signing ES256 JWTs the
//! registry verifies against the certificate in its `rootcertbundle`.
//!
//! Users: `testuser:testpass` (pull and push everywhere, answer carries `token` and
//! `access_token`), `accessuser:accesspass` (pull, answer carries only `access_token`),
//! `shortuser:shortpass` (pull, tokens live 2 s), `reuseuser:reusepass` (pull). Anonymous
//! callers may pull, except from repositories under `private/`. Requests are counted per user
//! name presented (right password or not), so concurrent tests can each watch their own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use rcgen::{CertificateParams, KeyPair, PublicKeyData as _};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};

pub const SERVICE: &str = "tolerable-test-registry";
pub const ISSUER: &str = "tolerable-test-issuer";

pub struct TokenServer {
    pub port: u16,
    /// PEM of the signing certificate: the registry's `rootcertbundle`.
    pub cert_pem: String,
    requests: Arc<Mutex<HashMap<String, usize>>>,
}

impl TokenServer {
    pub fn realm(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.port)
    }

    /// Token requests so far that presented `user` ("" for anonymous), any outcome.
    pub fn requests_by(&self, user: &str) -> usize {
        self.requests
            .lock()
            .unwrap()
            .get(user)
            .copied()
            .unwrap_or(0)
    }

    pub fn start() -> Self {
        let key = KeyPair::generate().unwrap();
        let cert_pem = CertificateParams::new(vec!["token-signer".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem();
        let signer = Arc::new(Signer {
            kid: libtrust_key_id(&key.subject_public_key_info()),
            key: EcdsaKeyPair::from_pkcs8(
                &ECDSA_P256_SHA256_FIXED_SIGNING,
                &key.serialize_der(),
                &SystemRandom::new(),
            )
            .unwrap(),
        });
        let requests = Arc::new(Mutex::new(HashMap::new()));
        let counter = requests.clone();
        let port = super::serve_http(move |req| issue(&signer, req, &counter));
        Self {
            port,
            cert_pem,
            requests,
        }
    }
}

struct Signer {
    kid: String,
    key: EcdsaKeyPair,
}

fn b64url(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

/// The key id libtrust (and so distribution) derives from a public key: base32 of the first 240
/// bits of sha256(DER SubjectPublicKeyInfo), in groups of four separated by `:`.
fn libtrust_key_id(spki_der: &[u8]) -> String {
    let hash = ring::digest::digest(&ring::digest::SHA256, spki_der);
    let b32 = base32(&hash.as_ref()[..30]);
    b32.as_bytes()
        .chunks(4)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join(":")
}

fn base32(data: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    let (mut buffer, mut bits) = (0u32, 0u32);
    for &byte in data {
        buffer = (buffer << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((buffer >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buffer << (5 - bits)) & 31) as usize] as char);
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

fn issue(
    signer: &Signer,
    req: &Request<hyper::body::Incoming>,
    counter: &Mutex<HashMap<String, usize>>,
) -> Response<Full<Bytes>> {
    if req.uri().path() != "/token" {
        return json_response(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": "not found"}),
        );
    }
    let scopes = requested_scopes(req);
    let user = basic_credentials(req);
    let name = user
        .as_deref()
        .map_or("", |u| u.split(':').next().unwrap_or(""));
    *counter.lock().unwrap().entry(name.to_owned()).or_default() += 1;
    let (subject, ttl, access_token_only, may_push) = match user.as_deref() {
        None => ("", 300, false, false),
        Some("testuser:testpass") => ("testuser", 300, false, true),
        Some("accessuser:accesspass") => ("accessuser", 300, true, false),
        Some("shortuser:shortpass") => ("shortuser", 2, false, false),
        Some("reuseuser:reusepass") => ("reuseuser", 300, false, false),
        Some(_) => {
            return json_response(
                StatusCode::UNAUTHORIZED,
                serde_json::json!({"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]}),
            )
        }
    };
    let access = granted_access(&scopes, subject, may_push);
    let token = signer.token(subject, ttl, access);
    let body = if access_token_only {
        serde_json::json!({"access_token": token, "expires_in": ttl})
    } else {
        serde_json::json!({"token": token, "access_token": token, "expires_in": ttl})
    };
    json_response(StatusCode::OK, body)
}

/// The `scope` query parameters, decoded (each may hold several scopes, space-separated).
fn requested_scopes(req: &Request<hyper::body::Incoming>) -> Vec<String> {
    let mut scopes = Vec::new();
    for pair in req.uri().query().unwrap_or("").split('&') {
        if let Some(("scope", value)) = pair.split_once('=') {
            scopes.push(percent_decode(value));
        }
    }
    scopes
}

/// `user:password` from a Basic `Authorization` header; None for an anonymous caller.
fn basic_credentials(req: &Request<hyper::body::Incoming>) -> Option<String> {
    req.headers()
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|raw| String::from_utf8(raw).ok())
}

/// The token's `access` claim: for each `type:name:actions` scope, the actions granted.
/// Anyone may pull except anonymous callers from `private/`; only `may_push` users push.
fn granted_access(scopes: &[String], subject: &str, may_push: bool) -> Vec<serde_json::Value> {
    scopes
        .iter()
        .flat_map(|s| s.split(' '))
        .filter_map(|scope| {
            let (kind, rest) = scope.split_once(':')?;
            let (name, actions) = rest.rsplit_once(':')?;
            let granted: Vec<&str> = actions
                .split(',')
                .filter(|a| match *a {
                    "pull" => !subject.is_empty() || !name.starts_with("private/"),
                    "push" => may_push,
                    _ => false,
                })
                .collect();
            Some(serde_json::json!({"type": kind, "name": name, "actions": granted}))
        })
        .collect()
}

impl Signer {
    /// An ES256 JWT for `subject` ("" for anonymous), valid `ttl` seconds from now.
    fn token(&self, subject: &str, ttl: u64, access: Vec<serde_json::Value>) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claims = serde_json::json!({
            "iss": ISSUER, "sub": if subject.is_empty() { "anonymous" } else { subject }, "aud": SERVICE,
            "exp": now + ttl, "nbf": now - 5, "iat": now, "jti": format!("{now}-{}", rand_id()),
            "access": access,
        });
        let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "kid": self.kid});
        let signing_input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let signature = self
            .key
            .sign(&SystemRandom::new(), signing_input.as_bytes())
            .unwrap();
        format!("{signing_input}.{}", b64url(signature.as_ref()))
    }
}

fn rand_id() -> u64 {
    let mut bytes = [0u8; 8];
    ring::rand::SecureRandom::fill(&SystemRandom::new(), &mut bytes).unwrap();
    u64::from_le_bytes(bytes)
}
