//! Input parsed once, at the edge, into what the core takes: names, serving settings, token limits, and the
//! typed command of every write (a new worker, a new catalog model, a deploy, a plan change, a GPU's
//! sharing, an account, an API token). The REST handlers parse their bodies into these, the console's
//! adapters build them from the pages' typed fields; a command whose fields are private is made only by
//! its parse, so the core never holds one that breaks these rules. What needs the committed state (a name
//! taken, a revision gone stale) or the caller's role (who may set what) stays the core's to check.
//!
//! Below the fleet and the accounts, so that both, and every edge above them, can name the same types.

use crate::catalog::{CatalogModel, Engine};
use crate::error::ApiError;
use app::auth::Role;
use app::views::{TokenLimits, TokenScope};
use placement::scale::Autoscale;
use placement::sharing::{GpuSharing, Sharing as GpuMode, SharingError};
use placement::{BasisPoints, Demand, GpuChoice, GpuRef, RequestedResources, WorkerRequest};
use std::collections::BTreeMap;

/// The longest worker name.
pub const MAX_NAME_LEN: usize = 63;

/// Names are what URLs, logs and process names carry: letters, digits, `.`, `-`, `_`, at most 63.
pub fn check_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::Unprocessable(format!(
            "name {name:?}: use 1 to {MAX_NAME_LEN} letters, digits, '.', '-' or '_', starting with a letter or digit"
        )))
    }
}

/// The most extra arguments and environment variables one recipe or deployment takes.
const MAX_SETTINGS: usize = 64;
/// The longest argument, variable value, command template or model path.
const MAX_SETTING_LEN: usize = 4096;

fn check_text(what: &str, text: &str) -> Result<(), ApiError> {
    if text.len() > MAX_SETTING_LEN {
        return Err(ApiError::Unprocessable(format!(
            "{what} is {} bytes long; at most {MAX_SETTING_LEN}",
            text.len()
        )));
    }
    if text.contains('\0') {
        return Err(ApiError::Unprocessable(format!(
            "{what} contains a NUL character, which no program can be given"
        )));
    }
    Ok(())
}

/// A serving configuration (extra arguments and environment) that a process can be started with.
fn check_serving(args: &[String], env: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if args.len() > MAX_SETTINGS || env.len() > MAX_SETTINGS {
        return Err(ApiError::Unprocessable(format!(
            "at most {MAX_SETTINGS} extra arguments and {MAX_SETTINGS} environment variables"
        )));
    }
    for (i, arg) in args.iter().enumerate() {
        check_text(&format!("extra argument {}", i + 1), arg)?;
    }
    for (name, value) in env {
        check_text(&format!("the value of {name}"), value)?;
    }
    check_env(env)
}

/// Environment variable names as a shell and the engines take them.
fn check_env(env: &BTreeMap<String, String>) -> Result<(), ApiError> {
    match env.keys().find(|k| !placement::names::is_env_name(k)) {
        Some(k) => Err(ApiError::Unprocessable(format!(
            "environment variable name {k:?}: {}",
            placement::names::ENV_NAME_RULE
        ))),
        None => Ok(()),
    }
}

/// A deployment's own serving configuration, as asked: extra arguments and environment variables that a
/// process can be started with. Who may set which is the core's to say ([`crate::fleet::authority`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServingSettings {
    args: Vec<String>,
    env: BTreeMap<String, String>,
}

impl ServingSettings {
    /// `args` and `env` if a process can be started with them.
    pub fn parse(
        args: Vec<String>,
        env: BTreeMap<String, String>,
    ) -> Result<ServingSettings, ApiError> {
        check_serving(&args, &env)?;
        Ok(ServingSettings { args, env })
    }

    /// Arguments added to the model's recipe.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Environment variables added to the model's recipe.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// The arguments and the environment.
    pub fn into_parts(self) -> (Vec<String>, BTreeMap<String, String>) {
        (self.args, self.env)
    }
}

/// A worker to accept (seed 000): its name, what it asks for (as sent, and read once), its command and
/// its environment.
#[derive(Debug, Clone)]
pub struct NewWorker {
    name: String,
    requested_resources: RequestedResources,
    request: WorkerRequest,
    command: Option<String>,
    env: BTreeMap<String, String>,
}

impl NewWorker {
    /// A worker named `name` asking for `requested_resources`, refused with what to fix.
    pub fn parse(
        name: String,
        requested_resources: RequestedResources,
        command: Option<String>,
        env: BTreeMap<String, String>,
    ) -> Result<NewWorker, ApiError> {
        check_name(&name)?;
        check_serving(&[], &env)?;
        if let Some(command) = &command {
            check_text("command", command)?;
        }
        let request = WorkerRequest::from_wire(&requested_resources)
            .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
        Ok(NewWorker {
            name,
            requested_resources,
            request,
            command,
            env,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What it asked for, as sent: stored so, and shown back.
    pub fn requested_resources(&self) -> &RequestedResources {
        &self.requested_resources
    }

    /// What it asked for, read: what the scheduler places.
    pub fn request(&self) -> &WorkerRequest {
        &self.request
    }

    /// The command to run.
    pub fn command(&self) -> Option<&str> {
        self.command.as_deref()
    }

    /// Environment variables for it.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }
}

/// A model to add to the catalog: a recipe whose fields hold, beyond whether its arguments override what
/// Tessera sets (which the runtime knows: [`crate::fleet::authority::check_recipe_args`]).
#[derive(Debug, Clone)]
pub struct NewModel(CatalogModel);

impl NewModel {
    /// `model` if its name, share, command template and settings hold.
    pub fn parse(model: CatalogModel) -> Result<NewModel, ApiError> {
        check_name(&model.name)?;
        if model.default_share == BasisPoints::ZERO || model.default_share > BasisPoints::WHOLE {
            return Err(ApiError::Unprocessable(
                "default_share_percent must be more than 0 and at most 100".to_owned(),
            ));
        }
        if model.engine == Engine::Command
            && model
                .command
                .as_deref()
                .and_then(shlex::split)
                .is_none_or(|words| words.is_empty())
        {
            return Err(ApiError::Unprocessable(format!(
                "{} runs on the command engine, so it needs a \"command\" template, such as \"my-server --port {{port}} --model {{model}}\" (without unclosed quotes)",
                model.name
            )));
        }
        check_recipe(&model)?;
        Ok(NewModel(model))
    }

    /// The recipe.
    pub fn model(&self) -> &CatalogModel {
        &self.0
    }

    /// The recipe, to store.
    pub fn into_model(self) -> CatalogModel {
        self.0
    }
}

/// A catalog recipe's fields, beyond its name and share.
fn check_recipe(model: &CatalogModel) -> Result<(), ApiError> {
    if let Some(group) = &model.group {
        check_name(group)?;
    }
    check_text("model_path", &model.model_path)?;
    if let Some(command) = &model.command {
        check_text("command", command)?;
    }
    check_serving(&model.args, &model.env)
}

/// A deploy as the fleet takes it, every field already read: the REST API parses one from its body, the
/// console builds one from the wizard's typed fields.
#[derive(Debug, Clone)]
pub struct DeployCommand {
    /// The catalog model.
    pub model: String,
    /// The GPUs chosen.
    pub gpus: GpuChoice,
    /// A share of a group's GPUs, or GPUs whole.
    pub sharing: Sharing,
    /// The deployment's own serving configuration.
    pub serving: ServingSettings,
}

/// How a deployed model takes its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sharing {
    /// A share of each GPU, in the group that runs there or in a new one.
    Shared {
        /// Its share; the catalog's default share when none.
        share: Option<BasisPoints>,
        /// New shares for other members of the group it joins.
        shares: BTreeMap<String, BasisPoints>,
        /// The revision of the group it joins; required when it joins one.
        revision: Option<i64>,
        /// Always loaded, or loaded when asked for.
        demand: Demand,
        /// New demand for other members of the group it joins.
        demands: BTreeMap<String, Demand>,
        /// Replicas that follow its load, one per machine of the group at most; none: one on each.
        replicas: Option<Autoscale>,
    },
    /// The GPUs whole, all of one machine.
    Whole,
}

impl Sharing {
    /// The sharing a deploy asks for: with `shared` off it takes GPUs whole, and then no share, shares or
    /// revision belong to it.
    pub fn new(
        shared: bool,
        share: Option<BasisPoints>,
        shares: BTreeMap<String, BasisPoints>,
        revision: Option<i64>,
        demand: Demand,
        demands: BTreeMap<String, Demand>,
        replicas: Option<Autoscale>,
    ) -> Result<Sharing, ApiError> {
        Autoscale::check_demand(replicas, demand)
            .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
        if shared {
            return Ok(Sharing::Shared {
                share,
                shares,
                revision,
                demand,
                demands,
                replicas,
            });
        }
        if replicas.is_some() {
            return Err(ApiError::Unprocessable(
                "replicas are for a model that shares its GPUs: deploy it with \"shared\": true"
                    .to_owned(),
            ));
        }
        if demand.is_on_demand() || !demands.is_empty() {
            return Err(ApiError::Unprocessable(
                "a model on whole GPUs is always loaded: deploy it with \"shared\": true to load it on demand".to_owned(),
            ));
        }
        if share.is_some() || !shares.is_empty() || revision.is_some() {
            return Err(ApiError::Unprocessable(
                "a deploy on whole GPUs takes no share, shares or revision; leave them out, or deploy with \"shared\": true".to_owned(),
            ));
        }
        Ok(Sharing::Whole)
    }
}

/// A plan change as the fleet takes it: every member's share, against the revision it was read at. A
/// member left out has no explicit share, which the verdict refuses.
#[derive(Debug, Clone)]
pub struct PlanCommand {
    /// The revision the plan was read at.
    pub revision: i64,
    /// Each member's share.
    pub shares: BTreeMap<String, BasisPoints>,
    /// Members whose demand changes (pinned, or on demand with a keep-alive); the others keep theirs.
    pub demand: BTreeMap<String, Demand>,
}

/// How a GPU is to be shared: time-slicing, MPS, or cut into MIG instances of the profiles named. Whether
/// the GPU can be (where it runs, what its model offers, what runs on it) is the fleet's to say.
#[derive(Debug, Clone)]
pub struct SharingCommand {
    gpu: GpuRef,
    sharing: GpuSharing,
    instances: Vec<String>,
}

impl SharingCommand {
    /// `gpu` shared in `mode` (`time-slicing`, `mps` or `mig`), with MPS's compute limit and, under MIG
    /// only, the instance profiles.
    pub fn parse(
        gpu: GpuRef,
        mode: &str,
        compute_percent: Option<i64>,
        instances: Option<Vec<String>>,
    ) -> Result<SharingCommand, ApiError> {
        let sharing = GpuSharing::parse(mode, compute_percent)
            .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
        let instances = match instances {
            Some(_) if sharing.mode != GpuMode::Mig => {
                return Err(ApiError::Unprocessable(
                    SharingError::InstancesWithoutMig.to_string(),
                ))
            }
            instances => instances.unwrap_or_default(),
        };
        Ok(SharingCommand {
            gpu,
            sharing,
            instances,
        })
    }

    /// The GPU, its sharing, and the MIG profiles it is cut into (none unless under MIG).
    pub fn into_parts(self) -> (GpuRef, GpuSharing, Vec<String>) {
        (self.gpu, self.sharing, self.instances)
    }
}

/// The shortest password accepted.
pub const MIN_PASSWORD_LEN: usize = 12;
/// The longest: argon2 takes any length, but a megabyte of "password" is an attack on the CPU.
pub const MAX_PASSWORD_LEN: usize = 1024;

/// An account to make: a good name, a role, and a password long enough (and not too long to hash).
#[derive(Clone)]
pub struct NewUser {
    name: String,
    role: Role,
    password: String,
}

impl NewUser {
    /// The account `name` with `role` and `password`, refused with what to fix.
    pub fn parse(name: String, role: Role, password: String) -> Result<NewUser, ApiError> {
        check_name(&name)?;
        let len = password.chars().count();
        if !(MIN_PASSWORD_LEN..=MAX_PASSWORD_LEN).contains(&len) {
            return Err(ApiError::Unprocessable(format!(
                "a password needs {MIN_PASSWORD_LEN} to {MAX_PASSWORD_LEN} characters; this one has {len}"
            )));
        }
        Ok(NewUser {
            name,
            role,
            password,
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Its password, to hash.
    pub fn password(&self) -> &str {
        &self.password
    }
}

// The password stays out of logs.
impl std::fmt::Debug for NewUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewUser")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// An API token to make: its name and its limits as stored.
#[derive(Debug, Clone)]
pub struct NewToken {
    name: String,
    limits: TokenLimits,
}

impl NewToken {
    /// The token `name` limited by `limits`, refused with what to fix.
    pub fn parse(name: String, limits: TokenLimits) -> Result<NewToken, ApiError> {
        let limits = check_limits(limits)?;
        check_name(&name)?;
        Ok(NewToken { name, limits })
    }

    /// What it is for, such as `ci`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its limits, as stored.
    pub fn limits(&self) -> &TokenLimits {
        &self.limits
    }
}

/// A token's limits as stored, if they hold: models only for an inference token and each a name (sorted,
/// once each), an expiry to come (in UTC, to the second).
fn check_limits(limits: TokenLimits) -> Result<TokenLimits, ApiError> {
    let TokenLimits {
        scope,
        mut models,
        expires_at,
    } = limits;
    if let Some(models) = &mut models {
        if scope != TokenScope::Inference {
            return Err(ApiError::Unprocessable(
                "models limits an inference token: set scope to \"inference\", or leave models out"
                    .to_owned(),
            ));
        }
        if models.is_empty() {
            return Err(ApiError::Unprocessable(
                "models names at least one model; leave it out for every model".to_owned(),
            ));
        }
        for model in models.iter() {
            check_name(model)?;
        }
        models.sort();
        models.dedup();
    }
    Ok(TokenLimits {
        scope,
        models,
        expires_at: expires_at.as_deref().map(expiry).transpose()?,
    })
}

/// An expiry as stored (RFC 3339 in UTC, to the second), if `text` is one and is still to come.
fn expiry(text: &str) -> Result<String, ApiError> {
    use time::format_description::well_known::Rfc3339;
    let at = time::OffsetDateTime::parse(text, &Rfc3339).map_err(|_| {
        ApiError::Unprocessable(format!(
            "expires_at is a time in RFC 3339, like 2027-01-31T00:00:00Z; {text:?} is not"
        ))
    })?;
    if at <= time::OffsetDateTime::now_utc() {
        return Err(ApiError::Unprocessable(format!(
            "expires_at {text} has passed; give a time to come"
        )));
    }
    at.to_offset(time::UtcOffset::UTC)
        .replace_nanosecond(0)
        .ok()
        .and_then(|at| at.format(&Rfc3339).ok())
        .ok_or_else(|| ApiError::Unprocessable(format!("expires_at {text} is out of range")))
}
