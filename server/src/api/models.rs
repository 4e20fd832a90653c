//! The model catalog: the models one can deploy, adding one, and a model's memory estimate.

use super::{page, ApiJson};
use crate::auth::Actor;
use crate::catalog::CatalogModel;
use crate::console::ConsoleService;
use crate::error::ApiError;
use crate::fleet::authority::Sight;
use crate::fleet::groups::engine_name;
use crate::input::NewModel;
use crate::AppState;
use app::views::ModelRow;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::Json;
use placement::estimate::{Assumed, Estimate, Settings};
use placement::rightsize::Fit;
use placement::Bytes;
use serde::{Deserialize, Serialize};

/// `GET /api/models`' query: a page, and the models of one engine or one recipe's group.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ModelsQuery {
    limit: Option<String>,
    cursor: Option<String>,
    engine: Option<String>,
    group: Option<String>,
}

pub(super) async fn list_models(
    State(state): State<AppState>,
    Actor(actor): Actor,
    uri: Uri,
    q: Result<Query<ModelsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = page::query(q)?;
    let models: Vec<CatalogModel> = state
        .fleet
        .models_shown(Sight::of(&actor))
        .into_iter()
        .filter(|m| {
            page::matches(q.engine.as_deref(), Some(engine_name(m.engine)))
                && page::matches(q.group.as_deref(), m.group.as_deref())
        })
        .collect();
    let asked = page::PageQuery {
        limit: q.limit,
        cursor: q.cursor,
    };
    page::page(models, |m| m.name.clone(), &asked, &uri)
}

pub(super) async fn add_model(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(model): ApiJson<CatalogModel>,
) -> Result<(StatusCode, Json<CatalogModel>), ApiError> {
    // The recipe's JSON is the catalog's own, as `GET /api/models` answers it.
    let model = NewModel::parse(model)?;
    Ok((
        StatusCode::CREATED,
        Json(state.fleet.add_model(model, &actor.name).await?),
    ))
}

/// `GET /api/models/{name}`'s answer.
#[derive(Debug, Serialize)]
pub(super) struct ModelAnswer {
    /// The model.
    name: String,
    /// Its recipe in the catalog (secrets redacted for all but admins), where it has one.
    recipe: Option<CatalogModel>,
    /// How it runs, as the Models tab shows it (engines, share, on demand, replicas and their last scale
    /// steps), where it is deployed.
    deployed: Option<ModelRow>,
}

/// `GET /api/models/{name}`: the model's recipe and, where it is deployed, how it runs.
pub(super) async fn get_model(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(name): Path<String>,
) -> Result<Json<ModelAnswer>, ApiError> {
    let recipe = state
        .fleet
        .models_shown(Sight::of(&actor))
        .into_iter()
        .find(|m| m.name == name);
    let console = ConsoleService::new(
        state.fleet.clone(),
        state.pool.clone(),
        state.tokens.clone(),
    );
    let deployed = console.deployed_model(&name).await?;
    if recipe.is_none() && deployed.is_none() {
        return Err(ApiError::NotFound(format!(
            "no model named {name} is in the catalog or deployed"
        )));
    }
    Ok(Json(ModelAnswer {
        name,
        recipe,
        deployed,
    }))
}

/// One GPU's peak as the REST API answers it: the figures, and what the rule makes of them.
#[derive(Debug, Serialize)]
pub(super) struct PeakAnswer {
    /// The machine.
    machine: String,
    /// The GPU's index there.
    gpu: u32,
    /// The most its engine was measured to hold there.
    peak_bytes: u64,
    /// The share it held.
    share_bytes: u64,
    /// The GPU's memory.
    gpu_total_bytes: u64,
    /// How long it has run on this share, measured: its first reading to its last.
    observed_ms: u64,
    /// `smaller`, `close`, `past`, `fills_share` or `fits`.
    verdict: &'static str,
    /// Where `smaller`: the share, percent, that holds the peak with a fifth to spare.
    smaller_share_percent: Option<f64>,
    /// The Models tab's line.
    line: String,
}

/// `GET /api/models/{name}/peaks`: the most the model's engines were measured to hold of the share they
/// hold now, per GPU, the fullest first; empty until a reading measured one, and for a model on whole GPUs.
pub(super) async fn model_peaks(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Vec<PeakAnswer>>, ApiError> {
    let peaks = state.fleet.model_peaks(&name).await?;
    Ok(Json(
        peaks
            .into_iter()
            .map(|p| {
                let fit = p.peak.fit();
                let verdict = match fit {
                    Fit::Smaller { .. } => "smaller",
                    Fit::Close => "close",
                    Fit::Past => "past",
                    Fit::FillsShare => "fills_share",
                    Fit::Fits => "fits",
                };
                PeakAnswer {
                    line: p.peak.line(),
                    machine: p.machine,
                    gpu: p.gpu,
                    peak_bytes: p.peak.peak.get(),
                    share_bytes: p.peak.share.get(),
                    gpu_total_bytes: p.peak.gpu_total.get(),
                    observed_ms: p.peak.observed_ms,
                    verdict,
                    smaller_share_percent: match fit {
                        Fit::Smaller { share } => Some(share.as_percent_f64()),
                        _ => None,
                    },
                }
            })
            .collect(),
    ))
}

/// `GET /api/models/{name}/estimate`'s query: what llama.cpp would be told, and where the model would run.
#[derive(Debug, Deserialize)]
pub(super) struct EstimateQuery {
    /// Each slot's context in tokens; the model's own when absent or 0.
    context: Option<u32>,
    /// Requests served at once; 1 when absent.
    slots: Option<u32>,
    /// The KV cache type of keys and values; f16 when absent.
    cache_type: Option<String>,
    /// The machine the model would run on, whose copy of the file is read; this machine's when absent.
    machine: Option<String>,
}

/// A part of the estimate, in bytes and in GB (2^30 bytes, as every GB of the API).
#[derive(Debug, Serialize)]
struct Part {
    bytes: u64,
    gb: f64,
}

impl From<Bytes> for Part {
    fn from(bytes: Bytes) -> Part {
        Part {
            bytes: bytes.get(),
            gb: (bytes.as_gb_f64() * 100.0).round() / 100.0,
        }
    }
}

/// The estimate's parts; `null` for a part that could not be estimated (see `gaps`).
#[derive(Debug, Serialize)]
struct Parts {
    weights: Part,
    kv_cache: Option<Part>,
    /// A recurrent or hybrid model's state (Mamba's, RWKV's), one per slot; absent for a model without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    recurrent_state: Option<Part>,
    compute: Option<Part>,
    output: Option<Part>,
}

/// A model's memory estimate as the REST API answers it.
#[derive(Debug, Serialize)]
pub(super) struct EstimateView {
    model: String,
    /// Every part estimated, together: with gaps, the least the model needs.
    total: Part,
    /// Whether every part was estimated.
    complete: bool,
    parts: Parts,
    assumed: Assumed,
    gaps: Vec<String>,
    caveats: Vec<String>,
    /// Everything the estimate found: tensors by type, per-layer weights, cache cells.
    detail: Estimate,
}

pub(super) async fn estimate_model(
    State(state): State<AppState>,
    Actor(_): Actor,
    Path(name): Path<String>,
    query: Result<Query<EstimateQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EstimateView>, ApiError> {
    let Query(query) = query.map_err(|_| {
        ApiError::BadRequest(
            "context and slots must be whole numbers, such as ?context=8192&slots=4&cache_type=q8_0"
                .to_owned(),
        )
    })?;
    let settings = Settings::chosen(
        query.context,
        query.slots.unwrap_or(1),
        query.cache_type.as_deref().unwrap_or("f16"),
    )
    .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
    let estimate = state
        .fleet
        .estimate_model(&name, query.machine.as_deref(), settings)
        .await?;
    Ok(Json(EstimateView {
        model: name,
        total: estimate.total().into(),
        complete: estimate.is_complete(),
        parts: Parts {
            weights: estimate.weights.bytes.into(),
            kv_cache: estimate.kv_cache.map(|kv| kv.bytes.into()),
            recurrent_state: estimate.recurrent.map(|r| r.bytes.into()),
            compute: estimate.compute.map(|c| c.bytes.into()),
            output: estimate.output.map(Part::from),
        },
        assumed: estimate.assumed,
        gaps: estimate.gaps.iter().map(ToString::to_string).collect(),
        caveats: estimate.caveats.iter().map(ToString::to_string).collect(),
        detail: estimate,
    }))
}

#[cfg(test)]
mod tests {
    use crate::testing::{majin_and_atlas_with_catalog, TestApp, MAJIN};
    use axum::http::{Method, StatusCode};
    use placement::estimate::writer::llama;
    use serde_json::json;

    /// A catalog with one llama.cpp model whose file is a tiny GGUF written here.
    async fn with_tiny_model(dir: &std::path::Path) -> (TestApp, u64) {
        let gguf = llama(2, 256, 512, 4, 2, 1000, 1);
        let path = dir.join("tiny.gguf");
        std::fs::write(&path, gguf.header()).unwrap();
        let app = TestApp::new(MAJIN).await;
        let body = json!({"name": "tiny", "engine": "llamacpp", "default_share_percent": 5,
                          "group": null, "model_path": path});
        let (status, body) = app
            .call(Method::POST, "/api/models", Some(&body.to_string()))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        (app, gguf.table_bytes())
    }

    #[tokio::test]
    async fn a_gguf_models_estimate_shows_each_part_and_what_it_assumed() {
        let dir = tempfile::tempdir().unwrap();
        let (app, table) = with_tiny_model(dir.path()).await;
        let (status, body) = app
            .get("/api/models/tiny/estimate?context=2048&slots=2&cache_type=q8_0")
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["model"], "tiny");
        assert_eq!(body["parts"]["weights"]["bytes"], table);
        assert_eq!(body["assumed"]["context"], 2048);
        assert_eq!(body["assumed"]["slots"], 2);
        assert_eq!(body["assumed"]["ctx_size"], 4096);
        assert_eq!(body["assumed"]["cache_type_k"], "q8_0");
        assert_eq!(body["complete"], true);
        assert_eq!(body["gaps"], json!([]));
        let parts = ["weights", "kv_cache", "compute", "output"]
            .iter()
            .map(|p| body["parts"][p]["bytes"].as_u64().unwrap())
            .sum::<u64>();
        assert_eq!(body["total"]["bytes"], parts);
        let (_, f16) = app
            .get("/api/models/tiny/estimate?context=2048&slots=2")
            .await;
        assert!(
            f16["parts"]["kv_cache"]["bytes"].as_u64()
                > body["parts"]["kv_cache"]["bytes"].as_u64(),
            "an f16 cache is larger than a q8_0 one: {f16}"
        );
    }

    #[tokio::test]
    async fn no_context_asked_means_the_models_own() {
        let dir = tempfile::tempdir().unwrap();
        let (app, _) = with_tiny_model(dir.path()).await;
        let (status, body) = app.get("/api/models/tiny/estimate").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["assumed"]["context"], 4096);
        assert_eq!(body["assumed"]["context_from_model"], true);
        assert_eq!(body["assumed"]["slots"], 1);
    }

    #[tokio::test]
    async fn settings_out_of_range_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (app, _) = with_tiny_model(dir.path()).await;
        let (status, body) = app.get("/api/models/tiny/estimate?slots=0").await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(body["error"], "slots must be from 1 to 1024, not 0");
        let (status, body) = app.get("/api/models/tiny/estimate?cache_type=q4_K").await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(body["error"].as_str().unwrap().contains("q4_K"), "{body}");
        let (status, _) = app.get("/api/models/tiny/estimate?context=many").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn a_model_that_cannot_be_read_gets_no_estimate_and_says_why() {
        let app = majin_and_atlas_with_catalog().await;
        let (status, body) = app.get("/api/models/nothing/estimate").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"], "no model nothing in the catalog");
        let (status, body) = app.get("/api/models/speech/estimate").await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            body["error"],
            "models/speech.gguf does not exist on this machine"
        );
        let (status, body) = app.get("/api/models/glm-5.3/estimate").await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .ends_with("give the model a downloaded folder as its model_path for an estimate"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_plans_verdict_carries_each_catalog_members_estimate_and_warns_where_its_share_is_below_it(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (app, _) = with_tiny_model(dir.path()).await;
        let (_, estimate) = app.get("/api/models/tiny/estimate").await;
        let needed = estimate["total"]["bytes"].as_u64().unwrap();
        // 0.01 % of majin's 8 GB GPU is about 0.8 MB, less than the tiny model needs; 10 % is plenty.
        for (share, warned) in [(0.01, true), (10.0, false)] {
            let plan = json!({"members": [{"name": "tiny", "share": share}, {"name": "not-in-catalog", "share": 5}],
                              "gpus": ["majin:0"]});
            let (status, verdict) = app
                .call(Method::POST, "/api/plans/validate", Some(&plan.to_string()))
                .await;
            assert_eq!(status, StatusCode::OK, "{verdict}");
            assert_eq!(verdict["verdict"], "fits");
            let estimates = verdict["estimates"].as_array().unwrap();
            assert_eq!(estimates.len(), 1, "only catalog models: {verdict}");
            assert_eq!(estimates[0]["member"], "tiny");
            assert_eq!(estimates[0]["needed_bytes"], needed);
            assert_eq!(estimates[0]["warning"].is_string(), warned, "{verdict}");
        }
    }

    #[tokio::test]
    async fn a_vllm_models_folder_is_estimated_for_its_max_model_len_from_the_recipe_or_the_query()
    {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                "max_position_embeddings": 32768, "vocab_size": 300, "torch_dtype": "bfloat16"}"#,
        )
        .unwrap();
        let header = json!({"model.layers.0.mlp.up_proj.weight": {"dtype": "BF16", "shape": [64, 128], "data_offsets": [0, 16384]}});
        let json = serde_json::to_vec(&header).unwrap();
        let mut shard = (json.len() as u64).to_le_bytes().to_vec();
        shard.extend(json);
        std::fs::write(dir.path().join("model.safetensors"), shard).unwrap();
        let app = TestApp::new(MAJIN).await;
        let body = json!({"name": "small", "engine": "vllm", "default_share_percent": 5,
                          "model_path": dir.path(), "args": ["--max-model-len", "4096"]});
        let (status, body) = app
            .call(Method::POST, "/api/models", Some(&body.to_string()))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        // 2 × 2 heads × 16 × 2 bytes × 2 layers = 256 bytes a token.
        let (status, body) = app.get("/api/models/small/estimate").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["parts"]["weights"]["bytes"], 16384);
        assert_eq!(body["parts"]["kv_cache"]["bytes"], 256 * 4096);
        assert_eq!(body["assumed"]["context"], 4096);
        assert!(
            body["caveats"][0].as_str().unwrap().contains("CUDA graphs"),
            "{body}"
        );
        let (_, body) = app
            .get("/api/models/small/estimate?context=1000&slots=3")
            .await;
        assert_eq!(body["parts"]["kv_cache"]["bytes"], 256 * 1008 * 3);
    }
}
