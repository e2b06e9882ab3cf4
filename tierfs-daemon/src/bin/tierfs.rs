//! `tierfs`: mount, unmount and inspect tierfs workspaces (see `tierfs --help`).
//!
//! Exit status: 0 success, 1 failure, 2 usage error (clap's own).

use std::process::ExitCode;

use clap::Parser;
use tierfs_daemon::cli::{Cli, Command};
use tierfs_daemon::{commands, launch, logging, store_link};

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == launch::SERVE_COMMAND) {
        // `tierfs mount`'s background daemon: this executable again, already in the page
        // cache (launch::daemon_executable). First, before any thread, as tierfs-daemon does.
        store_link::take_passphrase_env();
        tierfs_daemon::private::private_umask();
        let cli = tierfs_daemon::cli::ServeCli::parse_from(std::env::args_os().skip(1));
        return tierfs_daemon::frontend::serve_main(cli.ready_fd, cli.mountpoint.as_deref());
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // A usage error is a failure of kind invalid_input for a --json caller too.
            if err.use_stderr() && std::env::args_os().any(|a| a == "--json") {
                let rendered = err.render().to_string();
                let first = rendered.lines().next().unwrap_or_default();
                let message = first.strip_prefix("error: ").unwrap_or(first);
                println!("{}", serde_json::json!({ "ok": false, "error": message, "kind": "invalid_input" }));
            }
            err.exit();
        }
    };
    let serving = matches!(&cli.command, Command::Mount(m) if m.foreground);
    // fuser warns about every request it does not implement (e.g. the TCGETS ioctl of each
    // isatty()) and about its own redundant unmount: noise in a daemon log.
    logging::init(if serving { "info,fuser=error" } else { "warn,fuser=error" });
    match commands::run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let message = logging::shown_message(&err);
            if cli.json {
                // An error no cause gives a kind to is unexpected: `internal`.
                let kind = logging::error_kind(&err).unwrap_or(tierfs::ErrorKind::Internal);
                let mut json = serde_json::json!({ "ok": false, "error": message, "kind": kind.name() });
                if let Some(reason) = logging::error_reason(&err) {
                    json["reason"] = reason.name().into();
                }
                println!("{json}");
            }
            eprintln!("tierfs: error: {message}");
            ExitCode::FAILURE
        }
    }
}
