//! Progress on stderr through `indicatif`: a bar redrawn in place on a
//! terminal; where stderr is a file or a pipe (CI logs, scripts), the
//! loading steps as plain lines and no bar.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tessera_client::{Client, ClientError, LoadOptions, Network};

/// [`Client::load_network`] with the loading shown as it goes.
pub async fn load_network(
    client: &Client,
    model: impl Into<bytes::Bytes>,
    options: LoadOptions,
) -> Result<Network, ClientError> {
    let loading = Loading::new();
    client
        .load_network_with_progress(model, options, |what, done, total| {
            loading.report(what, done, total)
        })
        .await
}

/// A model's loading as the coordinator reports it: QueryNetwork on each
/// worker, each stage's bytes sent, compilation, deployment.
struct Loading {
    bar: ProgressBar,
}

impl Loading {
    fn new() -> Loading {
        let bar = ProgressBar::with_draw_target(Some(1), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("#> "),
        );
        Loading { bar }
    }

    /// One report: `done` of `total` (steps, or bytes while a stage is
    /// sent) of `what`.
    fn report(&self, what: &str, done: u64, total: u64) {
        if self.bar.is_hidden() {
            eprintln!("[{done}/{total}] {what}");
            return;
        }
        self.bar.set_length(total);
        self.bar.set_position(done);
        self.bar.set_message(what.to_string());
    }
}

impl Drop for Loading {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Requests answered out of `total` (`tessera bench`); nothing where
/// stderr is not a terminal.
pub fn requests(total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} requests, {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("#> "),
    );
    bar
}
