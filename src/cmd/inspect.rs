//! `tolerable inspect IMAGE...`: what the webhook would learn about each image.

use std::io::Write;
use std::process::ExitCode;

use serde_json::{json, Value};

use crate::cli::{InspectArgs, INSPECT_FAILED, INSPECT_OK};
use crate::config::Config;
use crate::registry::{Checked, CredentialStore, ImagePlatforms, ImageReference, LookupError};

pub(crate) async fn run(
    config: &Config,
    args: &InspectArgs,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let resolver = crate::engine::resolver(config, None)?;
    let results =
        futures_util::future::join_all(args.images.iter().map(|image| resolver.resolve(image)))
            .await;
    let verified = if args.verify {
        let budget = crate::budget::for_verify(config.resolver.lookup_timeout);
        let store = CredentialStore::default();
        let checks = args
            .images
            .iter()
            .map(|image| resolver.verify(image, &store, budget));
        Some(futures_util::future::join_all(checks).await)
    } else {
        None
    };
    let mislabelled = verified.iter().flatten().any(|v| {
        v.as_ref()
            .is_ok_and(|checked| checked.iter().any(Checked::mislabelled))
    });
    let failed = results.iter().any(Result::is_err) || mislabelled;
    if args.json {
        let items: Vec<Value> = args
            .images
            .iter()
            .zip(&results)
            .enumerate()
            .map(|(i, (image, result))| {
                let mut item = json_item(image, result.as_deref());
                if let Some(verified) = &verified {
                    item["verified"] = verified_json(&verified[i]);
                }
                item
            })
            .collect();
        serde_json::to_writer_pretty(&mut *out, &items)?;
        writeln!(out)?;
    } else {
        for (i, (image, result)) in args.images.iter().zip(&results).enumerate() {
            match result {
                Ok(found) => {
                    writeln!(out, "{image}")?;
                    writeln!(out, "  reference:  {}", normalized(image))?;
                    writeln!(out, "  digest:     {}", found.digest)?;
                    writeln!(out, "  media type: {}", found.media_type)?;
                    match &found.fact.artifact {
                        Some(config_type) => writeln!(
                            out,
                            "  platforms:  any (an artifact, config {config_type}: it names no platform)"
                        )?,
                        None => {
                            let platforms: Vec<String> =
                                found.fact.platforms.iter().map(ToString::to_string).collect();
                            writeln!(out, "  platforms:  {}", platforms.join(", "))?;
                        }
                    }
                    writeln!(
                        out,
                        "  source:     {} ({})",
                        found.served_by, found.fact.credentials
                    )?;
                }
                Err(e) => write_error(out, image, e)?,
            }
            if let Some(verified) = &verified {
                writeln!(out, "  verified:   {}", verified_text(&verified[i]))?;
            }
        }
    }
    Ok(if failed { INSPECT_FAILED } else { INSPECT_OK }.into())
}

/// A failed lookup: the message as the webhook would warn, and the cause beside it.
fn write_error(out: &mut impl Write, image: &str, e: &LookupError) -> std::io::Result<()> {
    writeln!(out, "{image}\n  error: {e}")?;
    match e.cause() {
        Some(cause) => writeln!(out, "  cause: {cause}"),
        None => Ok(()),
    }
}

fn json_item(image: &str, result: Result<&ImagePlatforms, &LookupError>) -> Value {
    match result {
        Ok(found) => json!({
            "image": image,
            "reference": normalized(image),
            "digest": found.digest,
            "mediaType": found.media_type,
            "platforms": found.fact.platforms,
            "artifact": found.fact.artifact,
            "credentials": found.fact.credentials.to_string(),
        }),
        Err(e) => match e.cause() {
            Some(cause) => json!({ "image": image, "error": e.to_string(), "cause": cause }),
            None => json!({ "image": image, "error": e.to_string() }),
        },
    }
}

/// `linux/amd64 ok, linux/arm64 MISLABELLED: its config says linux/amd64`.
pub(crate) fn verified_text(verified: &Result<Vec<Checked>, LookupError>) -> String {
    match verified {
        Err(e) => format!("could not verify: {e}"),
        Ok(checked) if checked.is_empty() => "nothing to verify (a single manifest)".to_owned(),
        Ok(checked) => checked
            .iter()
            .map(|c| {
                if c.mislabelled() {
                    format!("{} MISLABELLED: its config says {}", c.claimed, c.actual)
                } else {
                    format!("{} ok", c.claimed)
                }
            })
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn verified_json(verified: &Result<Vec<Checked>, LookupError>) -> Value {
    match verified {
        Err(e) => json!({"error": e.to_string()}),
        Ok(checked) => Value::Array(
            checked
                .iter()
                .map(|c| {
                    json!({
                        "claimed": c.claimed.to_string(),
                        "config": c.actual.to_string(),
                        "mislabelled": c.mislabelled(),
                    })
                })
                .collect(),
        ),
    }
}

fn normalized(image: &str) -> String {
    ImageReference::parse(image).map_or_else(|_| image.to_owned(), |r| r.to_string())
}
