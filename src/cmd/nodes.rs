//! `tolerable nodes plan | taint | untaint`: the taints that keep single-architecture Pods off the
//! wrong nodes; `plan` also names the DaemonSets a new taint would take off its nodes.

mod agents;

use std::io::Write;
use std::process::ExitCode;

use crate::cli::{NodesArgs, NodesCommand, NODES_CHANGED, NODES_NO_CHANGE, NODES_WOULD_CHANGE};
use crate::cluster::connect;
use crate::cluster::nodes::{reconcile_taints, webhook_ready, TaintAction};
use crate::config::Config;
use crate::taints::NodePlan;

pub(crate) async fn run(
    config: &Config,
    args: &NodesArgs,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let command = &args.command;
    let client = connect::client(args.cluster.choice())
        .await
        .map_err(anyhow::Error::msg)?;
    let action = match command {
        NodesCommand::Plan => TaintAction::Plan,
        NodesCommand::Taint { force } => {
            if let Err(refused) = webhook_ready(&client).await {
                if *force {
                    writeln!(out, "warning: {refused}; tainting anyway (--force)")?;
                } else {
                    return Err(refused.into());
                }
            }
            TaintAction::Taint
        }
        NodesCommand::Untaint => TaintAction::Untaint,
    };
    let mut policy = config.taint_policy.clone();
    policy.force = matches!(command, NodesCommand::Taint { force: true });
    let plans = reconcile_taints(&client, &policy, action).await?;
    print_plans(&plans, action, out)?;
    if action == TaintAction::Plan && plans.iter().any(|p| !p.add.is_empty()) {
        print_node_agents(&client, &plans, out).await?;
    }
    let changes = plans.iter().any(NodePlan::changes);
    Ok(match action {
        TaintAction::Plan if changes => NODES_WOULD_CHANGE,
        TaintAction::Plan => NODES_NO_CHANGE,
        _ => NODES_CHANGED,
    }
    .into())
}

fn print_plans(
    plans: &[NodePlan],
    action: TaintAction,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let (add, remove) = match action {
        TaintAction::Plan => ("would add", "would remove"),
        _ => ("added", "removed"),
    };
    for plan in plans {
        let arch = plan.architecture.as_deref().unwrap_or("?");
        let mut what: Vec<String> = plan.add.iter().map(|t| format!("{add} {t}")).collect();
        what.extend(plan.remove.iter().map(|t| format!("{remove} {t}")));
        if let (true, Some(why)) = (what.is_empty(), &plan.refused) {
            what.push(format!("would refuse to taint: {why}"));
        }
        if what.is_empty() {
            what.push(if plan.note.is_empty() {
                "no change".into()
            } else {
                format!("no change: {}", plan.note)
            });
        }
        writeln!(out, "{:<24} {:<8} {}", plan.node, arch, what.join("; "))?;
    }
    Ok(())
}

/// The DaemonSets that would lose their Pods on the nodes to be tainted, after the plans; when
/// they cannot be listed (no RBAC to list DaemonSets and Pods), a warning saying so: the plan
/// stands without them.
async fn print_node_agents(
    client: &kube::Client,
    plans: &[NodePlan],
    out: &mut impl Write,
) -> std::io::Result<()> {
    match agents::daemonsets(client).await {
        Ok(daemonsets) => {
            let losing = crate::taints::agents_losing_nodes(plans, &daemonsets);
            if !losing.is_empty() {
                writeln!(out, "\nDaemonSets that would lose their Pods there:")?;
            }
            for line in losing {
                writeln!(out, "  {line}")?;
            }
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "warning: DaemonSets not checked ({e:#}): a DaemonSet whose template does not \
                 tolerate a new taint gets no Pod on those nodes once its Pods there are gone"
            );
        }
    }
    Ok(())
}
