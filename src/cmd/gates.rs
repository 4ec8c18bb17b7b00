//! `tolerable gates list | release`: the Pods tolerable's scheduling gate holds
//! (`on_lookup_failure = "gate"`), and their release by hand — before uninstalling tolerable (a
//! gate nobody removes holds its Pod forever), or in an emergency. A release is the gate
//! controller's own release-unchanged patch (`mutate::gate::release_unchanged`).

use std::io::Write;
use std::process::ExitCode;
use std::time::SystemTime;

use crate::cli::{GatesArgs, GatesCommand, GATES_LISTED, GATES_NOT_FOUND, GATES_RELEASED};
use crate::cluster::connect;
use crate::cluster::gates::{list_gated, ListedGate, PodsApi};
use crate::gates::{release_by_hand, HandRelease};

pub(crate) async fn run(args: &GatesArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let client = connect::client(args.cluster.choice())
        .await
        .map_err(anyhow::Error::msg)?;
    match &args.command {
        GatesCommand::List { namespace } => {
            let listed = list_gated(&client, namespace.as_deref()).await?;
            print_list(&listed, out)?;
            Ok(GATES_LISTED.into())
        }
        GatesCommand::Release {
            all,
            namespace,
            pods,
        } => {
            let targets: Vec<(String, String)> = if *all {
                let listed = list_gated(&client, namespace.as_deref()).await?;
                listed.into_iter().map(|g| (g.namespace, g.name)).collect()
            } else {
                let namespace = namespace.as_deref().unwrap_or("default");
                pods.iter()
                    .map(|p| (namespace.to_owned(), p.clone()))
                    .collect()
            };
            release(&PodsApi::new(client), &targets, out).await
        }
    }
}

async fn release(
    pods: &PodsApi,
    targets: &[(String, String)],
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let mut missing = false;
    for (namespace, name) in targets {
        let what = match release_by_hand(pods, namespace, name).await? {
            HandRelease::Released => "released unchanged",
            HandRelease::NotGated => "not gated by tolerable",
            HandRelease::NotFound => {
                missing = true;
                "not found"
            }
        };
        writeln!(out, "{namespace}/{name}: {what}")?;
    }
    if targets.is_empty() {
        writeln!(out, "no Pod is gated by tolerable")?;
    }
    Ok(if missing {
        GATES_NOT_FOUND
    } else {
        GATES_RELEASED
    }
    .into())
}

fn print_list(listed: &[ListedGate], out: &mut impl Write) -> std::io::Result<()> {
    if listed.is_empty() {
        return writeln!(out, "no Pod is gated by tolerable");
    }
    writeln!(
        out,
        "{:<20} {:<32} {:<11} {:>8}  DECISION",
        "NAMESPACE", "NAME", "STATE", "AGE"
    )?;
    let now = SystemTime::now();
    for gate in listed {
        let age = gate
            .created
            .and_then(|c| now.duration_since(c).ok())
            .map_or("?".to_owned(), |age| format!("{}s", age.as_secs()));
        let state = if gate.state == "true" {
            "waiting"
        } else {
            &gate.state
        };
        writeln!(
            out,
            "{:<20} {:<32} {:<11} {:>8}  {}",
            gate.namespace, gate.name, state, age, gate.decision
        )?;
    }
    Ok(())
}
