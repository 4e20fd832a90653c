//! The model catalog and its recipes.

use super::authority::{check_recipe_args, redact_args, redact_env, redact_json, Sight};
use super::groups::engine_name;
use super::Fleet;
use crate::catalog::{CatalogModel, Engine};
use crate::error::ApiError;
use crate::input::NewModel;
use crate::runtime::model_file::{
    estimate_folder, estimate_gguf, gguf_info, NoEstimate, ThisMachine,
};
use crate::runtime::sizing::{flag_value, sizing_for, Unsized};
use placement::estimate::hf::HfSettings;
use placement::estimate::{Estimate, Settings};
use placement::{BasisPoints, Bytes, GpuRef};
use std::collections::BTreeMap;
use std::sync::Arc;

impl Fleet {
    /// The model catalog, as of the last write.
    pub fn models(&self) -> Vec<CatalogModel> {
        self.committed().models.iter().cloned().collect()
    }

    /// The catalog as one who sees it with `sight` is shown it.
    pub fn models_shown(&self, sight: Sight) -> Vec<CatalogModel> {
        let mut models = self.models();
        if sight == Sight::Redacted {
            for m in &mut models {
                m.env = redact_env(&m.env, &m.secret_env);
                m.args = redact_args(&m.args);
            }
        }
        models
    }

    /// The names a model's recipe marks secret.
    pub fn secret_env_of(&self, model: &str) -> Vec<String> {
        self.committed()
            .model(model)
            .map(|m| m.secret_env.clone())
            .unwrap_or_default()
    }

    /// Adds a model to the catalog.
    pub async fn add_model(
        self: &Arc<Self>,
        model: NewModel,
        actor: &str,
    ) -> Result<CatalogModel, ApiError> {
        let actor = actor.to_owned();
        self.write(|fleet| async move { fleet.add_model_now(model, &actor).await })
            .await
    }

    async fn add_model_now(&self, model: NewModel, actor: &str) -> Result<CatalogModel, ApiError> {
        check_recipe_args(model.model())?;
        let model = model.into_model();
        let mut state = self.state.lock().await;
        let mut tx = crate::db::write(&self.pool).await?;
        sqlx::query("INSERT INTO models (name, engine, default_share, group_name, model_path, system, command, args, env, secret_env) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
            .bind(&model.name)
            .bind(engine_name(model.engine))
            .bind(i64::from(model.default_share.get()))
            .bind(&model.group)
            .bind(&model.model_path)
            .bind(model.system)
            .bind(&model.command)
            .bind(serde_json::to_string(&model.args).map_err(ApiError::internal)?)
            .bind(serde_json::to_string(&model.env).map_err(ApiError::internal)?)
            .bind(serde_json::to_string(&model.secret_env).map_err(ApiError::internal)?)
            .execute(&mut *tx)
            .await
            .map_err(|e| ApiError::on_unique(e, || format!("the catalog has a model named {} already", model.name)))?;
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(actor, "model.add", &model.name).after(redact_json(
                serde_json::to_value(&model).map_err(ApiError::internal)?,
                &model.secret_env,
            )),
        )
        .await?;
        self.finish(&mut state, tx, None, None).await?;
        Ok(model)
    }

    /// Adds the models the catalog lacks (the demo's), leaving the ones it has as they are.
    pub async fn seed_catalog(self: &Arc<Self>, models: &[CatalogModel]) -> Result<(), ApiError> {
        for model in models {
            match self
                .add_model(NewModel::parse(model.clone())?, crate::audit::TESSERA)
                .await
            {
                Ok(_) | Err(ApiError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The memory estimate of catalog model `name` under `settings`, read from the header of its file where
    /// it would run: `machine`'s, or this machine's when none is named. `NotFound` for no such model,
    /// `Unprocessable` with the reason for one that gets no estimate.
    pub async fn estimate_model(
        &self,
        name: &str,
        machine: Option<&str>,
        settings: Settings,
    ) -> Result<Estimate, ApiError> {
        let model = self
            .committed()
            .model(name)
            .cloned()
            .ok_or_else(|| ApiError::NotFound(format!("no model {name} in the catalog")))?;
        let unreadable = |reason: NoEstimate| ApiError::Unprocessable(reason.to_string());
        let files = match machine {
            Some(machine) => self
                .runtime
                .model_files(&self.hosts().host(machine), machine),
            None => Box::new(ThisMachine),
        };
        if matches!(model.engine, Engine::Vllm | Engine::Sglang) {
            let settings = hf_settings(&model.args, &settings);
            return estimate_folder(&*files, &model.model_path, &settings)
                .await
                .map_err(unreadable);
        }
        estimate_gguf(&*files, &model.model_path, &settings)
            .await
            .map_err(unreadable)
    }
}

/// vLLM's (or SGLang's) serving choices for an estimate: the context and slots asked for, else the
/// recipe's `--max-model-len` (SGLang's `--context-length`); its `--max-num-batched-tokens`.
fn hf_settings(args: &[String], asked: &Settings) -> HfSettings {
    let number = |flags: &[&str]| {
        crate::runtime::sizing::flag_value(args, flags).and_then(|v| v.parse::<u32>().ok())
    };
    let defaults = HfSettings::default();
    HfSettings {
        max_model_len: asked
            .context
            .or_else(|| number(&["--max-model-len", "--context-length"])),
        sequences: asked.slots,
        batched_tokens: number(&["--max-num-batched-tokens"]).unwrap_or(defaults.batched_tokens),
    }
}

impl Fleet {
    /// Judges the context and slots a llama.cpp model's arguments give it (`-c`, `-np` in its recipe's,
    /// then `serving`'s) against `share` of each of `gpus` (an engine per machine, holding its share on
    /// each of its GPUs there), by the estimate of its file where that can be read now: 422 with the
    /// figures where they take more, before anything is committed. A file that cannot be read now is
    /// judged as the engine starts, which refuses it with the same words.
    pub(crate) async fn judge_given_context(
        &self,
        model: &str,
        serving: &[String],
        gpus: &[GpuRef],
        share: BasisPoints,
    ) -> Result<(), ApiError> {
        let Some(recipe) = self.committed().model(model).cloned() else {
            return Ok(());
        };
        let args: Vec<String> = recipe.args.iter().chain(serving).cloned().collect();
        let given = flag_value(&args, &["-c", "--ctx-size", "-np", "--parallel"]).is_some();
        if recipe.engine != Engine::LlamaCpp || !given {
            return Ok(());
        }
        let mut held: BTreeMap<String, Bytes> = BTreeMap::new();
        {
            let state = self.state.lock().await;
            for gpu in gpus {
                if let Some(found) = state.ledger.inventory().gpu(gpu) {
                    *held.entry(gpu.machine.clone()).or_default() += found.total.share(share);
                }
            }
        }
        let hosts = self.hosts();
        for (machine, share) in held {
            let host = hosts.host(&machine);
            // The demo engine stands in where GPUs are made up: no file is read there.
            if !host.runs_daemons() {
                continue;
            }
            let files = self.runtime.model_files(&host, &machine);
            let Ok(info) = gguf_info(&*files, &recipe.model_path).await else {
                continue;
            };
            match sizing_for(Ok(&info), share, &args) {
                Err(Unsized::GivenOver(judged)) => {
                    return Err(ApiError::Unprocessable(format!(
                        "{model} is not deployed: as its arguments set it, {judged} on {machine}: lower \
                         its -c or -np, or give it a larger share"
                    )))
                }
                Err(Unsized::NotANumber(given)) => {
                    return Err(ApiError::Unprocessable(format!(
                        "{model} is not deployed: its -c is {given:?}, not a number of tokens"
                    )))
                }
                _ => {}
            }
        }
        Ok(())
    }
}
