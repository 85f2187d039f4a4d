//! The cluster page at `/` and the JSON API behind it.
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /` | the page (HTML, CSS and JS embedded in the binary; no data, open without a token) |
//! | `GET /assets/app.js`, `/assets/app.css` | its script and style |
//! | `GET /api/cluster` | [`ClusterDoc`]: coordinators, workers, devices, memory, load, state |
//! | `GET /api/models` | [`ModelsDoc`]: models, copies, plans as subgraphs |
//! | `GET /api/models/{name}/subgraphs/{id}` | [`SubgraphNodesDoc`]: one subgraph's nodes, op types and why |
//! | `GET /api/live` | [`LiveDoc`]: per model, now and the last 5 minutes |
//! | `GET /api/live/stream` | the same as server-sent events (`event: live`), one a second |
//!
//! `/api/` wants the front door's token like every other endpoint; the
//! page asks for one when it gets 401 and keeps it in the tab's session
//! storage.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use super::HttpError;
use crate::views::{ClusterDoc, LiveDoc, ModelsDoc, SubgraphNodesDoc};
use crate::Door;

/// The page's files, embedded.
const INDEX_HTML: &str = include_str!("../page/index.html");
const APP_JS: &str = include_str!("../page/app.js");
const APP_CSS: &str = include_str!("../page/app.css");

/// Paths served without a token: the page and its assets carry no data.
pub const OPEN: [&str; 3] = ["/", "/assets/app.js", "/assets/app.css"];

/// How often the live stream sends the figures.
const LIVE_EVERY: Duration = Duration::from_secs(1);

/// The page's routes.
pub fn routes() -> Router<Arc<Door>> {
    Router::new()
        .route("/", get(index))
        .route("/assets/app.js", get(app_js))
        .route("/assets/app.css", get(app_css))
        .route("/api/cluster", get(cluster))
        .route("/api/models", get(models))
        .route("/api/models/{name}/subgraphs/{id}", get(subgraph))
        .route("/api/live", get(live))
        .route("/api/live/stream", get(live_stream))
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

async fn index() -> impl IntoResponse {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn app_css() -> impl IntoResponse {
    asset("text/css; charset=utf-8", APP_CSS)
}

async fn cluster(State(door): State<Arc<Door>>) -> Result<Json<ClusterDoc>, HttpError> {
    Ok(Json(door.cluster_doc().await?))
}

async fn models(State(door): State<Arc<Door>>) -> Result<Json<ModelsDoc>, HttpError> {
    Ok(Json(door.models_doc().await?))
}

async fn subgraph(
    State(door): State<Arc<Door>>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Json<SubgraphNodesDoc>, HttpError> {
    let id: usize = id
        .parse()
        .map_err(|_| HttpError::bad_request(format!("'{id}' is not a subgraph number")))?;
    Ok(Json(door.subgraph_doc(&name, id).await?))
}

async fn live(State(door): State<Arc<Door>>) -> Json<LiveDoc> {
    Json(door.live_doc())
}

/// The live document at once, then every second, until the client goes
/// away or the front door closes.
async fn live_stream(
    State(door): State<Arc<Door>>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let ticks = futures_util::stream::unfold((door, true), |(door, first)| async move {
        if !first {
            tokio::select! {
                () = tokio::time::sleep(LIVE_EVERY) => {}
                () = door.closed() => return None,
            }
        }
        let data = serde_json::to_string(&door.live_doc()).unwrap_or_else(|_| "{}".into());
        Some((Ok(Event::default().event("live").data(data)), (door, false)))
    });
    Sse::new(ticks).keep_alive(KeepAlive::default())
}
