//! `outboxctl`: outboxd's operators' calls from a shell. Exit codes are a
//! contract for scripts: 0 ok, 1 the server refused the call (or, for
//! `health`, a service is not SERVING), 2 usage, 3 the server cannot be reached.

mod cli;
mod output;

use std::{
    io::{BufRead, IsTerminal, Write},
    process::ExitCode,
};

use clap::Parser;
use outboxd::{
    client::{self, BearerToken, ClientTls, Credentials},
    pb::{
        self, outbox_admin_client::OutboxAdminClient, outbox_service_client::OutboxServiceClient,
    },
};
use tonic::{Code, Status, service::interceptor::InterceptedService, transport::Channel};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use cli::{BlockedKeys, Cli, Command, DeadLetters};
use output::Out;

type Admin = OutboxAdminClient<InterceptedService<Channel, Credentials>>;
type Service = OutboxServiceClient<InterceptedService<Channel, Credentials>>;

/// How a command ended, as its exit code says.
enum Failure {
    /// The server answered with an error: exit 1.
    Refused(Status),
    /// Bad flags or files, or no confirmation: exit 2.
    Usage(String),
    /// The health service answered, but not SERVING for every service
    /// (these): exit 1.
    NotServing(String),
    /// Nothing answered (refused connection, TLS handshake, unavailable): exit 3.
    Unreachable(Status),
}

impl From<Status> for Failure {
    fn from(status: Status) -> Self {
        // tonic reports a connection it could not make (refused, timed out,
        // failed TLS handshake) as UNAVAILABLE, as outboxd does when its
        // database is down: either way, retrying later is the answer.
        if status.code() == Code::Unavailable || is_transport(&status) {
            Self::Unreachable(status)
        } else {
            Self::Refused(status)
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // clap prints its own errors and exits 2 (0 for --help and --version).
    let cli = Cli::parse();
    let server = cli.server.clone();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Refused(status)) => {
            eprintln!(
                "outboxctl: the server refused the call: {:?}: {}",
                status.code(),
                status.message()
            );
            ExitCode::from(1)
        }
        Err(Failure::NotServing(which)) => {
            eprintln!("outboxctl: not SERVING: {which}");
            ExitCode::from(1)
        }
        Err(Failure::Usage(why)) => {
            eprintln!("outboxctl: {why}");
            ExitCode::from(2)
        }
        Err(Failure::Unreachable(status)) if is_transport(&status) => {
            eprintln!(
                "outboxctl: cannot reach the server at {server}: {}",
                describe(&status)
            );
            ExitCode::from(3)
        }
        Err(Failure::Unreachable(status)) => {
            eprintln!(
                "outboxctl: the server at {server} is unavailable: {}",
                describe(&status)
            );
            ExitCode::from(3)
        }
    }
}

/// A call that never reached the service: tonic answers a connection that
/// broke during set-up (plaintext to a TLS port, say) with UNKNOWN
/// "transport error", or a status whose source is the transport's error.
fn is_transport(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        if cause.is::<tonic::transport::Error>() {
            return true;
        }
        source = cause.source();
    }
    status.code() == Code::Unknown && status.message() == "transport error"
}

/// Why a call got no answer, each reason once: tonic puts the cause (such as
/// "Connection refused") in the status's source chain, and repeats its
/// message there ("tcp connect error" three times, with "transport error"
/// between), so a part already said, or that says nothing, is left out.
fn describe(status: &Status) -> String {
    let mut parts: Vec<String> = vec![status.message().to_owned()];
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        parts.push(cause.to_string());
        source = cause.source();
    }
    let mut said: Vec<String> = Vec::new();
    for part in parts {
        let part = part.trim();
        if part.is_empty() || part == "transport error" || said.iter().any(|s| s.contains(part)) {
            continue;
        }
        said.push(part.to_owned());
    }
    if said.is_empty() {
        return format!("{:?}", status.code());
    }
    said.join(": ")
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let out = Out::new(cli.output);
    if let Command::Health { services } = &cli.command {
        let (channel, credentials) = channel(&cli)?;
        return health(
            HealthClient::with_interceptor(channel, credentials),
            services,
            &out,
        )
        .await;
    }
    let (admin, service) = connect(&cli)?;
    match cli.command {
        Command::Health { .. } => unreachable!("answered above"),
        Command::Stats { outbox } => stats(admin, service, outbox, &out).await,
        Command::DeadLetters(DeadLetters::List {
            outbox,
            aggregate,
            limit,
        }) => {
            let reply = admin
                .clone()
                .list_dead_letters(pb::ListDeadLettersRequest {
                    outbox: outbox.name.clone(),
                    aggregate_id: aggregate.unwrap_or_default(),
                    page_size: limit.limit,
                    page_token: String::new(),
                })
                .await?
                .into_inner();
            out.dead_letters(&outbox.name, &reply);
            Ok(())
        }
        Command::BlockedKeys(BlockedKeys::List { outbox, limit }) => {
            let reply = admin
                .clone()
                .list_blocked_keys(pb::ListBlockedKeysRequest {
                    outbox: outbox.name.clone(),
                    page_size: limit.limit,
                    page_token: String::new(),
                })
                .await?
                .into_inner();
            out.blocked_keys(&outbox.name, &reply);
            Ok(())
        }
        Command::Inspect { outbox, id } => {
            let reply = admin
                .clone()
                .inspect_message(pb::InspectMessageRequest {
                    outbox: outbox.name.clone(),
                    message_id: id,
                })
                .await?
                .into_inner();
            out.inspect(&outbox.name, &reply);
            Ok(())
        }
        Command::Redrive {
            outbox,
            select,
            confirm,
        } => {
            let what = if select.all {
                "every dead letter".to_owned()
            } else if let Some(aggregate) = &select.aggregate {
                format!("the dead letters of aggregate {aggregate:?}")
            } else {
                format!("{} dead letter(s)", select.ids.len())
            };
            confirmed(
                confirm.yes,
                &format!("Redrive {what} in outbox {:?}?", outbox.name),
            )?;
            let reply = admin
                .clone()
                .redrive(pb::RedriveRequest {
                    outbox: outbox.name.clone(),
                    message_ids: select.ids,
                    aggregate_id: select.aggregate.unwrap_or_default(),
                    all: select.all,
                })
                .await?
                .into_inner();
            out.count(&outbox.name, "redriven", reply.redriven);
            Ok(())
        }
        Command::Discard {
            outbox,
            ids,
            confirm,
        } => {
            let question = format!(
                "Discard {} dead letter(s) in outbox {:?} for good?",
                ids.len(),
                outbox.name
            );
            confirmed(confirm.yes, &question)?;
            let reply = admin
                .clone()
                .discard(pb::DiscardRequest {
                    outbox: outbox.name.clone(),
                    message_ids: ids,
                })
                .await?
                .into_inner();
            out.count(&outbox.name, "discarded", reply.discarded);
            Ok(())
        }
    }
}

/// `stats` of one outbox, or of every outbox ListOutboxes names: those the
/// caller holds an admin scope for, with a count of the others, so a token
/// for some outboxes sees those rather than a refusal.
async fn stats(
    mut admin: Admin,
    mut service: Service,
    outbox: Option<String>,
    out: &Out,
) -> Result<(), Failure> {
    let (names, hidden) = match outbox {
        Some(name) => (vec![name], 0),
        None => {
            let listed = admin
                .list_outboxes(pb::ListOutboxesRequest {})
                .await?
                .into_inner();
            let names = listed.outboxes.into_iter().map(|o| o.name).collect();
            (names, listed.hidden)
        }
    };
    let mut all = Vec::with_capacity(names.len());
    for name in names {
        let stats = service
            .get_stats(pb::GetStatsRequest {
                outbox: name.clone(),
            })
            .await?
            .into_inner();
        all.push((name, stats));
    }
    // The watchdog's findings, when this caller may read them (an admin
    // scope) and the first sample is in; the outboxes' figures stand alone
    // otherwise.
    let database = match admin
        .get_database_report(pb::GetDatabaseReportRequest {})
        .await
    {
        Ok(reply) => Some(reply.into_inner()),
        Err(status)
            if matches!(
                status.code(),
                Code::Unavailable | Code::PermissionDenied | Code::Unimplemented
            ) =>
        {
            None
        }
        Err(status) => return Err(status.into()),
    };
    out.stats(&all, hidden, database.as_ref());
    Ok(())
}

/// How long one health check may take: a probe that hangs is a failed probe.
const HEALTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `health`: every service asked, each answer printed, then SERVING or not.
/// An unknown service name is a refusal (NOT_FOUND, exit 1), as is any
/// status other than SERVING.
async fn health(
    mut client: HealthClient<InterceptedService<Channel, Credentials>>,
    services: &[String],
    out: &Out,
) -> Result<(), Failure> {
    let mut answers = Vec::with_capacity(services.len());
    for service in services {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: service.clone(),
        });
        request.set_timeout(HEALTH_TIMEOUT);
        let status = client.check(request).await?.into_inner().status();
        answers.push((service.as_str(), status.as_str_name()));
    }
    out.health(&answers);
    let failing: Vec<String> = answers
        .iter()
        .filter(|(_, status)| *status != ServingStatus::Serving.as_str_name())
        .map(|(service, status)| format!("{service:?} is {status}"))
        .collect();
    if failing.is_empty() {
        Ok(())
    } else {
        Err(Failure::NotServing(failing.join(", ")))
    }
}

/// A destructive call goes ahead with `--yes`, or when a person at a terminal
/// says so; a script without `--yes` is a usage error, never a silent yes.
fn confirmed(yes: bool, question: &str) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::Usage(
            "this changes rows: pass --yes to confirm (stdin is not a terminal to ask on)".into(),
        ));
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::Usage(format!("cannot read the answer: {e}")))?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(Failure::Usage("not confirmed; nothing changed".into()))
    }
}

/// One channel for both services, with the relay's TLS and token rules.
fn connect(cli: &Cli) -> Result<(Admin, Service), Failure> {
    let (channel, credentials) = channel(cli)?;
    let admin = OutboxAdminClient::with_interceptor(channel.clone(), credentials.clone())
        .max_decoding_message_size(client::MAX_RESPONSE_BYTES);
    let service = OutboxServiceClient::with_interceptor(channel, credentials)
        .max_decoding_message_size(client::MAX_RESPONSE_BYTES);
    Ok((admin, service))
}

/// The channel to `--server` (lazy: nothing is dialled before the first
/// call) and the token every call carries.
fn channel(cli: &Cli) -> Result<(Channel, Credentials), Failure> {
    // Without --tls-ca, an https:// server is checked against the system's
    // roots, as a publicly signed certificate needs.
    let tls = if cli.tls_ca.is_some() || cli.tls_cert.is_some() {
        let tls = match &cli.tls_ca {
            Some(ca) => ClientTls::new(read(ca, "--tls-ca")?),
            None => ClientTls::system_roots(),
        };
        Some(match (&cli.tls_cert, &cli.tls_key) {
            (Some(cert), Some(key)) => {
                tls.with_identity(read(cert, "--tls-cert")?, read(key, "--tls-key")?)
            }
            _ => tls,
        })
    } else {
        None
    };
    let credentials = match &cli.token_file {
        Some(path) => {
            let token = client::read_token(path)
                .map_err(|e| Failure::Usage(format!("--token-file {e}")))?;
            let token = BearerToken::new(&token)
                .map_err(|e| Failure::Usage(format!("--token-file {}: {e}", path.display())))?;
            Credentials::bearer(token)
        }
        None => Credentials::none(),
    };
    let channel = client::channel_lazy(&cli.server, tls.as_ref())
        .map_err(|e| Failure::Usage(format!("--server {e}")))?;
    Ok((channel, credentials))
}

fn read(path: &std::path::Path, flag: &str) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| Failure::Usage(format!("{flag} {}: {e}", path.display())))
}
