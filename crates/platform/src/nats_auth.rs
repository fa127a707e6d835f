//! Who may say what on the bus: each service connects as its own NATS user, allowed to publish
//! and subscribe to the subjects it needs and nothing else, optionally over TLS.
//!
//! [`permissions`] is the one table of those subjects, derived from the same [`Names`] the
//! services use; [`authorization_block`] renders it as the `authorization` block of a
//! nats-server configuration (`switchboard-nats-config` prints it for deployments, the cluster
//! tests load it). A service's replies go to its own inbox prefix (`_INBOX_<service>.`), so no
//! service can read another's replies; request/reply endpoints answer with
//! `allow_responses` (only to the reply subject of a request they received).

use std::fmt::Write as _;
use std::path::PathBuf;

use protocol::messaging::Names;
use secrecy::SecretString;

/// How a service authenticates to NATS and whether the connection is TLS.
#[derive(Debug, Clone, Default)]
pub struct NatsCredentials {
    /// `SB_NATS_USER`: the service's user (unset: no authentication, local development).
    pub user: Option<String>,
    /// `SB_NATS_PASSWORD`: its password (required with a user).
    pub password: Option<SecretString>,
    /// `SB_NATS_CREDS_FILE`: a `.creds` file (JWT + nkey) instead of user and password.
    pub creds_file: Option<PathBuf>,
    /// `SB_NATS_TLS_CA_FILE`: the CA that signed the servers' certificates.
    pub tls_ca_file: Option<PathBuf>,
    /// `SB_NATS_TLS_CERT_FILE` and `SB_NATS_TLS_KEY_FILE`: a client certificate (mutual TLS).
    pub tls_client: Option<(PathBuf, PathBuf)>,
    /// `SB_NATS_TLS_REQUIRED`: refuse a server that does not speak TLS.
    pub tls_required: bool,
}

/// The services that connect to NATS.
pub const SERVICES: [&str; 4] = ["attachments", "runs", "history", "worker"];

/// What one service may publish and subscribe to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// Subjects it may publish to.
    pub publish: Vec<String>,
    /// Subjects it may not publish to although `publish` allows them: creating or changing the
    /// durable consumers of the other services.
    pub publish_deny: Vec<String>,
    /// Subjects it may subscribe to.
    pub subscribe: Vec<String>,
    /// Whether it answers requests (may publish to the reply subject of a request it got).
    pub responds: bool,
}

/// The inbox prefix of `service`: replies to its requests and its consumers' deliveries.
pub fn inbox_prefix(service: &str) -> String {
    format!("_INBOX_{service}")
}

/// The services whose permissions let them publish to `subject`: who may call that endpoint.
pub fn callers(names: &Names, subject: &str) -> Vec<&'static str> {
    SERVICES
        .iter()
        .filter(|service| {
            permissions(names, service).is_some_and(|p| {
                p.publish
                    .iter()
                    .any(|pattern| subject_matches(pattern, subject))
            })
        })
        .copied()
        .collect()
}

/// Whether `reply`, the reply subject of a request on `subject`, is the inbox of one of the
/// services allowed to call it ([`callers`]). Defence in depth: the bus's permissions keep a
/// service from publishing to an endpoint it may not call, but JetStream can deliver a stored
/// message to any subject with a reply subject of its own (a push consumer's delivery); an
/// endpoint answers only replies addressed to a caller's inbox, so such a delivery is not served.
pub fn reply_from_caller(names: &Names, subject: &str, reply: &str) -> bool {
    callers(names, subject).iter().any(|service| {
        reply
            .strip_prefix(&inbox_prefix(service))
            .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// NATS subject matching: `*` one token, `>` the rest.
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let (mut p, mut s) = (pattern.split('.'), subject.split('.'));
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The JetStream API subjects that read `stream` (inspect it, get messages, create and pull
/// from consumers, acknowledge). Not: create, update, delete or purge it (the admin's
/// `nats-setup` makes the streams and buckets; changing a stream's subjects or limits would let
/// a service capture others' replies or empty the stream), nor delete a consumer (another
/// service's durable). Creating consumers stays: KV watchers and ordered reads need it.
fn stream_access(stream: &str) -> Vec<String> {
    [
        "$JS.API.STREAM.INFO.{s}",
        "$JS.API.STREAM.MSG.GET.{s}",
        "$JS.API.DIRECT.GET.{s}",
        "$JS.API.DIRECT.GET.{s}.>",
        "$JS.API.CONSUMER.CREATE.{s}",
        "$JS.API.CONSUMER.CREATE.{s}.>",
        "$JS.API.CONSUMER.INFO.{s}.*",
        "$JS.API.CONSUMER.MSG.NEXT.{s}.*",
        "$JS.ACK.{s}.>",
        "$JS.FC.{s}.>",
    ]
    .iter()
    .map(|pattern| pattern.replace("{s}", stream))
    .collect()
}

/// A KV bucket: its stream's API and writing its keys.
fn bucket_access(bucket: &str) -> Vec<String> {
    let mut subjects = stream_access(&format!("KV_{bucket}"));
    subjects.push(format!("$KV.{bucket}.>"));
    subjects
}

/// The subjects `service` needs, or `None` for a service that does not connect to NATS.
pub fn permissions(names: &Names, service: &str) -> Option<Permissions> {
    let prefix = names.prefix();
    let streams = || {
        let mut subjects = vec!["$JS.API.INFO".to_owned()];
        subjects.extend(stream_access(&names.runs_stream()));
        subjects.extend(stream_access(&names.run_events_stream()));
        subjects
    };
    // Every bucket, written only where `writes` says so (read and watched in the others).
    let buckets = |writes: &dyn Fn(&str) -> bool| {
        [
            names.agents_bucket(),
            names.run_status_bucket(),
            names.thread_locks_bucket(),
            names.prompts_bucket(),
            names.prompt_deadlines_bucket(),
            names.thread_state_bucket(),
            names.owner_budgets_bucket(),
            names.owner_tokens_bucket(),
        ]
        .iter()
        .flat_map(|bucket| {
            if writes(bucket) {
                bucket_access(bucket)
            } else {
                stream_access(&format!("KV_{bucket}"))
            }
        })
        .collect::<Vec<_>>()
    };
    // The agent catalog is the workers' and a thread's remote-agent state the worker's: runs
    // reads them.
    let (agents, thread_state) = (names.agents_bucket(), names.thread_state_bucket());
    // The tokens used are the worker's to charge: runs reads them against the budgets.
    let tokens = names.owner_tokens_bucket();
    let runs_writes = |bucket: &str| bucket != agents && bucket != thread_state && bucket != tokens;
    let inbox = format!("{}.>", inbox_prefix(service));
    let permissions = match service {
        // Answers resolve, sign, register, generated-upload, erase and link; asks nothing.
        "attachments" => Permissions {
            // Account info (its readiness probe), and its per-owner rates in the owner budgets
            // bucket: reads the bucket, writes only its own rates' keys.
            publish: {
                let budgets = names.owner_budgets_bucket();
                let mut subjects = vec!["$JS.API.INFO".to_owned()];
                subjects.extend(stream_access(&format!("KV_{budgets}")));
                subjects.extend(
                    ["uploads", "downloads"].map(|rate| format!("$KV.{budgets}.rate-{rate}.*")),
                );
                subjects
            },
            subscribe: vec![inbox, format!("{prefix}.attachments.*")],
            responds: true,
            publish_deny: Vec::new(),
        },
        // Accepts runs, cancels them, follows their events, admits files, waits for history,
        // reads a thread's messages for a client joining it, renames threads.
        "runs" => Permissions {
            publish: [
                names.runs_subjects(),
                names.run_events_subjects(),
                names.run_cancel_subjects(),
                names.attachments_resolve_subject(),
                names.history_progress_subject(),
                names.history_run_lookup_subject(),
                names.history_thread_messages_subject(),
                names.history_thread_rename_subject(),
                names.history_thread_erase_subject(),
                names.history_owner_erase_subject(),
                names.history_thread_fork_subject(),
                names.threads_erased_subject(),
            ]
            .into_iter()
            .chain(streams())
            .chain(buckets(&runs_writes))
            .collect(),
            subscribe: vec![
                inbox,
                names.run_events_live_subjects(),
                names.threads_erased_subject(),
            ],
            responds: false,
            publish_deny: Vec::new(),
        },
        // Consumes runs and events into PostgreSQL, signs download links, says how far it is,
        // finds runs by id, renames and erases threads and owners.
        "history" => Permissions {
            // Deletes ended runs' tasks from RUNS (retention that follows consumption); erases
            // a thread's traces: its tasks and events (deleted, purged by subject), its keys in
            // the run buckets (the agent catalog excepted), an erased owner's records in the
            // budget buckets (purged by subject), and asks attachments to drop its files.
            publish: [
                names.attachments_sign_subject(),
                names.attachments_erase_subject(),
                names.attachments_link_subject(),
                format!("$JS.API.STREAM.MSG.DELETE.{}", names.runs_stream()),
                format!("$JS.API.STREAM.MSG.DELETE.{}", names.run_events_stream()),
                format!("$JS.API.STREAM.PURGE.{}", names.run_events_stream()),
                format!("$JS.API.STREAM.PURGE.KV_{}", names.owner_budgets_bucket()),
                format!("$JS.API.STREAM.PURGE.KV_{}", names.owner_tokens_bucket()),
            ]
            .into_iter()
            .chain(streams())
            .chain(buckets(&|bucket| bucket != agents))
            .collect(),
            subscribe: vec![
                inbox,
                names.history_progress_subject(),
                names.history_run_lookup_subject(),
                names.history_thread_messages_subject(),
                names.history_thread_rename_subject(),
                names.history_thread_erase_subject(),
                names.history_owner_erase_subject(),
                names.history_thread_fork_subject(),
            ],
            responds: true,
            publish_deny: Vec::new(),
        },
        // Runs agents: publishes their events, reads and registers files, hears cancels,
        // queues the run that continues after a prompt timed out; for a remote agent, reads the
        // thread's earlier messages and signs its files' download links.
        "worker" => Permissions {
            publish: [
                names.run_queue_subject(),
                names.run_events_subjects(),
                names.attachments_resolve_subject(),
                names.attachments_sign_subject(),
                names.attachments_register_subject(),
                names.attachments_generated_upload_subject(),
                names.history_thread_messages_subject(),
            ]
            .into_iter()
            .chain(streams())
            .chain(buckets(&|_| true))
            .collect(),
            subscribe: vec![inbox, names.run_cancel_subjects()],
            responds: false,
            publish_deny: Vec::new(),
        },
        _ => return None,
    };
    let mut permissions = permissions;
    permissions.publish_deny = others_durables(names, service);
    Some(permissions)
}

/// The durable consumers of the services other than `service`, as the JetStream API subjects
/// that create or change them: a service may create consumers (its KV watchers and ordered
/// reads need it), and JetStream's create is create-or-update, so without these it could
/// change another's durable (say, its filter) and starve it.
fn others_durables(names: &Names, service: &str) -> Vec<String> {
    use protocol::messaging::{HISTORY_EVENTS_CONSUMER, HISTORY_RUNS_CONSUMER, WORKER_CONSUMER};
    [
        ("history", names.runs_stream(), HISTORY_RUNS_CONSUMER),
        (
            "history",
            names.run_events_stream(),
            HISTORY_EVENTS_CONSUMER,
        ),
        ("worker", names.runs_stream(), WORKER_CONSUMER),
    ]
    .into_iter()
    .filter(|(owner, _, _)| *owner != service)
    .flat_map(|(_, stream, durable)| {
        [
            format!("$JS.API.CONSUMER.CREATE.{stream}.{durable}"),
            format!("$JS.API.CONSUMER.CREATE.{stream}.{durable}.>"),
        ]
    })
    .collect()
}

/// The `authorization` block of a nats-server configuration: one user per service with its
/// [`permissions`], its password read from the server's environment
/// (`$SB_NATS_PASSWORD_<SERVICE>`), and `admin` (`$SB_NATS_PASSWORD_ADMIN`) for operators'
/// tools with every permission.
pub fn authorization_block(names: &Names) -> String {
    let quoted = |subjects: &[String]| {
        subjects
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut block = String::from("authorization {\n  users = [\n");
    for service in SERVICES {
        let Some(p) = permissions(names, service) else {
            continue;
        };
        let var = format!("SB_NATS_PASSWORD_{}", service.to_uppercase());
        let _ = writeln!(
            block,
            "    {{ user: \"{service}\", password: ${var}, permissions: {{"
        );
        if p.publish.is_empty() {
            // Nothing but answers (`allow_responses`); an empty allow list would allow all.
            block.push_str("      publish: { deny: [\">\"] }\n");
        } else if p.publish_deny.is_empty() {
            let _ = writeln!(
                block,
                "      publish: {{ allow: [{}] }}",
                quoted(&p.publish)
            );
        } else {
            let _ = writeln!(
                block,
                "      publish: {{ allow: [{}], deny: [{}] }}",
                quoted(&p.publish),
                quoted(&p.publish_deny)
            );
        }
        let _ = writeln!(
            block,
            "      subscribe: {{ allow: [{}] }}",
            quoted(&p.subscribe)
        );
        if p.responds {
            let _ = writeln!(block, "      allow_responses: true");
        }
        block.push_str("    } },\n");
    }
    block.push_str("    { user: \"admin\", password: $SB_NATS_PASSWORD_ADMIN }\n  ]\n}\n");
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names::new("sb").unwrap()
    }

    fn allowed(subjects: &[String], subject: &str) -> bool {
        subjects
            .iter()
            .any(|pattern| super::subject_matches(pattern, subject))
    }

    #[test]
    fn no_service_may_create_change_or_delete_a_stream_or_delete_a_consumer() {
        let names = names();
        let streams = [
            names.runs_stream(),
            names.run_events_stream(),
            format!("KV_{}", names.run_status_bucket()),
            format!("KV_{}", names.agents_bucket()),
        ];
        for service in SERVICES {
            let publish = permissions(&names, service).unwrap().publish;
            for stream in &streams {
                for api in ["STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE"] {
                    let subject = format!("$JS.API.{api}.{stream}");
                    assert!(!allowed(&publish, &subject), "{service} may {subject}");
                }
                for api in ["CONSUMER.DELETE", "CONSUMER.DURABLE.CREATE"] {
                    let subject = format!("$JS.API.{api}.{stream}.history-runs");
                    assert!(!allowed(&publish, &subject), "{service} may {subject}");
                }
            }
        }
    }

    #[test]
    fn only_its_owner_may_create_or_change_a_durable_consumer() {
        use protocol::messaging::{
            HISTORY_EVENTS_CONSUMER, HISTORY_RUNS_CONSUMER, WORKER_CONSUMER,
        };
        let names = names();
        let durables = [
            ("history", names.runs_stream(), HISTORY_RUNS_CONSUMER),
            (
                "history",
                names.run_events_stream(),
                HISTORY_EVENTS_CONSUMER,
            ),
            ("worker", names.runs_stream(), WORKER_CONSUMER),
        ];
        for service in SERVICES {
            let p = permissions(&names, service).unwrap();
            let may =
                |subject: &str| allowed(&p.publish, subject) && !allowed(&p.publish_deny, subject);
            for (owner, stream, durable) in &durables {
                for subject in [
                    format!("$JS.API.CONSUMER.CREATE.{stream}.{durable}"),
                    format!("$JS.API.CONSUMER.CREATE.{stream}.{durable}.sb.runs.accepted.>"),
                ] {
                    let expected = service == *owner;
                    assert_eq!(may(&subject), expected, "{service} on {subject}");
                }
            }
            // An ephemeral consumer of its own (a KV watch) stays allowed where it reads.
            if service != "attachments" {
                let watch = format!(
                    "$JS.API.CONSUMER.CREATE.KV_{}.abc123.$KV.x.>",
                    names.run_status_bucket()
                );
                assert!(may(&watch), "{service} may not watch");
            }
        }
    }

    #[test]
    fn attachments_writes_its_own_rates_in_the_owner_budgets_and_nothing_else_there() {
        let names = names();
        let attachments = permissions(&names, "attachments").unwrap().publish;
        let budgets = names.owner_budgets_bucket();
        for rate in ["uploads", "downloads"] {
            let key = format!("$KV.{budgets}.rate-{rate}.0a1b2c");
            assert!(allowed(&attachments, &key), "attachments writes {key}");
        }
        for key in ["rate-runs.0a1b2c", "bytes.0a1b2c.20261127", "kept.0a1b2c"] {
            let key = format!("$KV.{budgets}.{key}");
            assert!(!allowed(&attachments, &key), "attachments writes {key}");
        }
        let read = format!("$JS.API.DIRECT.GET.KV_{budgets}.$KV.{budgets}.rate-uploads.0a1b2c");
        assert!(allowed(&attachments, &read), "attachments reads its rates");
        let status = names.run_status_bucket();
        assert!(
            !allowed(&attachments, &format!("$JS.API.STREAM.INFO.KV_{status}")),
            "attachments reads no other bucket"
        );
    }

    #[test]
    fn runs_reads_the_agent_catalog_and_thread_state_and_writes_neither() {
        let names = names();
        let runs = permissions(&names, "runs").unwrap().publish;
        let worker = permissions(&names, "worker").unwrap().publish;
        for bucket in [names.agents_bucket(), names.thread_state_bucket()] {
            let key = format!("$KV.{bucket}.some.key");
            assert!(!allowed(&runs, &key), "runs writes {bucket}");
            assert!(allowed(&worker, &key), "the worker writes {bucket}");
            let read = format!("$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.some.key");
            assert!(allowed(&runs, &read), "runs reads {bucket}");
        }
        let budgets = format!("$KV.{}.bytes.x", names.owner_budgets_bucket());
        assert!(allowed(&runs, &budgets), "runs writes the owner budgets");
    }

    #[test]
    fn an_endpoint_answers_only_replies_to_its_callers_inboxes() {
        let names = names();
        let sign = names.attachments_sign_subject();
        assert!(reply_from_caller(&names, &sign, "_INBOX_history.abc.1"));
        assert!(reply_from_caller(&names, &sign, "_INBOX_worker.abc.1"));
        for reply in [
            "_INBOX_runs.abc.1",   // runs may not sign
            "_INBOX.abc.1",        // no service's inbox
            "_INBOX_historyx.abc", // a prefix of another name
            "_INBOX_history",      // no token after the prefix
            "$JS.ACK.T_RUNS.pwn.1.2.3.4.5",
            "sb.attachments.register",
        ] {
            assert!(!reply_from_caller(&names, &sign, reply), "{reply}");
        }
        let register = names.attachments_register_subject();
        assert!(reply_from_caller(&names, &register, "_INBOX_worker.x"));
        assert!(!reply_from_caller(&names, &register, "_INBOX_history.x"));
    }

    #[test]
    fn only_the_services_that_need_them_may_call_the_attachments_endpoints() {
        let names = names();
        let callers = |subject: &str| super::callers(&names, subject);
        assert_eq!(
            callers(&names.attachments_sign_subject()),
            ["history", "worker"]
        );
        assert_eq!(
            callers(&names.attachments_resolve_subject()),
            ["runs", "worker"]
        );
        assert_eq!(callers(&names.attachments_register_subject()), ["worker"]);
        assert_eq!(
            callers(&names.attachments_generated_upload_subject()),
            ["worker"]
        );
        assert_eq!(callers(&names.history_progress_subject()), ["runs"]);
        assert_eq!(callers(&names.history_run_lookup_subject()), ["runs"]);
        assert_eq!(callers(&names.history_thread_rename_subject()), ["runs"]);
        assert_eq!(
            callers(&names.history_thread_messages_subject()),
            ["runs", "worker"]
        );
        let task = uuid::Uuid::now_v7();
        assert_eq!(callers(&names.run_event_subject(task)), ["runs", "worker"]);
        assert_eq!(callers(&names.run_queue_subject()), ["runs", "worker"]);
        assert_eq!(callers(&names.run_cancel_subject(task)), ["runs"]);
    }

    #[test]
    fn a_service_reads_only_its_own_inbox_and_no_service_may_delete_a_stream() {
        let names = names();
        for service in SERVICES {
            let p = permissions(&names, service).unwrap();
            for other in SERVICES.iter().filter(|o| **o != service) {
                assert!(
                    !allowed(&p.subscribe, &format!("{}.x", inbox_prefix(other))),
                    "{service} reads {other}'s replies"
                );
            }
            assert!(
                !allowed(&p.subscribe, "_INBOX.x"),
                "{service}: the shared inbox"
            );
            assert!(!allowed(
                &p.publish,
                &format!("$JS.API.STREAM.DELETE.{}", names.runs_stream())
            ));
            assert!(!allowed(
                &p.publish,
                &format!("$JS.API.STREAM.PURGE.{}", names.runs_stream())
            ));
            // Only history deletes single messages (ended runs' tasks, an erased run's late
            // events) and purges a run's events by subject (erasure); no one purges RUNS.
            for stream in [names.runs_stream(), names.run_events_stream()] {
                assert_eq!(
                    allowed(&p.publish, &format!("$JS.API.STREAM.MSG.DELETE.{stream}")),
                    service == "history",
                    "{service}"
                );
            }
            assert_eq!(
                allowed(
                    &p.publish,
                    &format!("$JS.API.STREAM.PURGE.{}", names.run_events_stream())
                ),
                service == "history",
                "{service}"
            );
            // The agent catalog is the workers' alone: history erases no key of it.
            assert_eq!(
                allowed(
                    &p.publish,
                    &format!("$KV.{}.agent.x", names.agents_bucket())
                ),
                service == "worker",
                "{service}"
            );
        }
        assert!(permissions(&names, "gateway").is_none());
    }

    #[test]
    fn the_block_names_every_service_with_its_password_variable() {
        let block = authorization_block(&names());
        for service in SERVICES {
            assert!(block.contains(&format!("user: \"{service}\"")), "{block}");
            assert!(block.contains(&format!("$SB_NATS_PASSWORD_{}", service.to_uppercase())));
        }
        assert_eq!(
            block.matches("allow_responses: true").count(),
            2,
            "attachments and history"
        );
    }
}
