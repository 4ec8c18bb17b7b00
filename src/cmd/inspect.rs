//! `tolerable inspect IMAGE...`: what the webhook would learn about each image.

use std::io::Write;
use std::process::ExitCode;

use serde_json::{json, Value};

use crate::cli::InspectArgs;
use crate::config::Config;
use crate::registry::{ImagePlatforms, ImageReference, LookupError};

pub(crate) async fn run(
    config: &Config,
    args: &InspectArgs,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let resolver = crate::app::resolver(config, None)?;
    let results =
        futures_util::future::join_all(args.images.iter().map(|image| resolver.resolve(image)))
            .await;
    let failed = results.iter().any(Result::is_err);
    if args.json {
        let items: Vec<Value> = args
            .images
            .iter()
            .zip(&results)
            .map(|(image, result)| json_item(image, result.as_deref()))
            .collect();
        serde_json::to_writer_pretty(&mut *out, &items)?;
        writeln!(out)?;
    } else {
        for (image, result) in args.images.iter().zip(&results) {
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
                Err(e) => writeln!(out, "{image}\n  error: {e}")?,
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
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
        Err(e) => json!({ "image": image, "error": e.to_string() }),
    }
}

fn normalized(image: &str) -> String {
    ImageReference::parse(image).map_or_else(|_| image.to_owned(), |r| r.to_string())
}
