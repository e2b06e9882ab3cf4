//! `tierfs`: mount, unmount and inspect tierfs workspaces (see `tierfs --help`).
//!
//! Exit status: 0 success, 1 failure, 2 usage error (clap's own).

use std::process::ExitCode;

use clap::Parser;
use tierfs_daemon::cli::{Cli, Command};
use tierfs_daemon::{commands, logging};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let serving = matches!(&cli.command, Command::Mount(m) if m.foreground);
    // fuser warns about every request it does not implement (e.g. the TCGETS ioctl of each
    // isatty()) and about its own redundant unmount: noise in a daemon log.
    logging::init(if serving { "info,fuser=error" } else { "warn,fuser=error" });
    match commands::run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let message = logging::error_message(&err);
            if cli.json {
                let mut json = serde_json::json!({ "ok": false, "error": message });
                if let Some(kind) = logging::error_kind(&err) {
                    json["kind"] = kind.name().into();
                }
                println!("{json}");
            }
            eprintln!("tierfs: error: {message}");
            ExitCode::FAILURE
        }
    }
}
