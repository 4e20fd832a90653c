//! The inventory file: machines described by hand, in TOML, for GPUs that NVML on this machine cannot see.
//!
//! ```toml
//! [[machine]]
//! name = "majin"
//! cpu_cores = 16
//! memory_gb = 64
//! all_gpus_visible = false   # true for a Windows PC under WSL2
//! [[machine.gpu]]
//! index = 0
//! model = "NVIDIA GeForce RTX 4060"
//! vendor = "nvidia"
//! memory_gb = 8
//! held_outside_gb = 1
//! healthy = true
//! ```
//!
//! Optional: `all_gpus_visible` (false), a GPU's `uuid` (empty), `vendor` (`nvidia`), `held_outside_gb`
//! (0) and `healthy` (true). Any other key is refused, so that a misspelt key is not silently ignored.
//! Every error names the line it is about.

use placement::{Bytes, Gpu, Inventory, InventoryError, Machine};
use serde::Deserialize;
use std::ops::Range;
use std::path::Path;
use toml::Spanned;

/// What is wrong with an inventory file.
#[derive(Debug, thiserror::Error)]
pub enum InventoryFileError {
    /// The file could not be read.
    #[error(
        "could not read the inventory file {file}: {source}; check the path given to --inventory"
    )]
    Read {
        /// The file as it was named.
        file: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file says something Tessera cannot take; `message` says what and where.
    #[error("{file}{}: {message}", place(*.line, *.column))]
    Invalid {
        /// The file as it was named.
        file: String,
        /// The 1-based line the problem is on, where it is known.
        line: Option<usize>,
        /// The 1-based column, for TOML syntax and type errors.
        column: Option<usize>,
        /// What is wrong.
        message: String,
    },
}

/// ` line 9` or ` line 9, column 3`, or nothing when the place is not known.
fn place(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(line), Some(column)) => format!(" line {line}, column {column}"),
        (Some(line), None) => format!(" line {line}"),
        (None, _) => String::new(),
    }
}

/// Reads the machines of an inventory file's text; errors name it `inventory.toml`.
pub fn parse_inventory(text: &str) -> Result<Vec<Machine>, InventoryFileError> {
    Reader {
        file: "inventory.toml",
        text,
    }
    .machines()
}

/// Reads the machines of the inventory file at `path`; errors name the file as given.
pub fn load_inventory(path: &Path) -> Result<Vec<Machine>, InventoryFileError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| InventoryFileError::Read {
        file: file.clone(),
        source,
    })?;
    Reader {
        file: &file,
        text: &text,
    }
    .machines()
}

/// The file as written, with the place of each figure that a later check may be about.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileForm {
    #[serde(default)]
    machine: Vec<MachineForm>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MachineForm {
    name: Spanned<String>,
    cpu_cores: u32,
    memory_gb: Spanned<f64>,
    #[serde(default)]
    all_gpus_visible: bool,
    #[serde(default)]
    gpu: Vec<GpuForm>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuForm {
    index: Spanned<u32>,
    #[serde(default)]
    uuid: String,
    model: String,
    #[serde(default = "nvidia")]
    vendor: String,
    memory_gb: Spanned<f64>,
    held_outside_gb: Option<Spanned<f64>>,
    #[serde(default = "healthy")]
    healthy: bool,
}

fn nvidia() -> String {
    "nvidia".to_owned()
}

fn healthy() -> bool {
    true
}

/// One file being read: its name for messages, and its text for turning byte offsets into lines.
struct Reader<'a> {
    file: &'a str,
    text: &'a str,
}

impl Reader<'_> {
    fn machines(&self) -> Result<Vec<Machine>, InventoryFileError> {
        let form: FileForm = toml::from_str(self.text).map_err(|e| {
            let (line, column) = e
                .span()
                .map(|span| self.line_and_column(span.start))
                .unzip();
            self.invalid(line, column, e.message().trim_end().to_owned())
        })?;
        let machines = form
            .machine
            .iter()
            .map(|m| self.machine(m))
            .collect::<Result<Vec<_>, _>>()?;
        // The rules about the whole fleet live in placement; here they only get a line number.
        match Inventory::new(machines.clone()) {
            Ok(_) => Ok(machines),
            Err(e) => {
                let line =
                    offending_span(&form.machine, &e).map(|s| self.line_and_column(s.start).0);
                Err(self.invalid(line, None, e.to_string()))
            }
        }
    }

    fn machine(&self, form: &MachineForm) -> Result<Machine, InventoryFileError> {
        let owner = format!("machine {:?}", form.name.get_ref());
        let gpus = form
            .gpu
            .iter()
            .map(|g| self.gpu(&owner, g))
            .collect::<Result<_, _>>()?;
        Ok(Machine {
            name: form.name.get_ref().clone(),
            cpu_cores: form.cpu_cores,
            memory: self.gb(&owner, "memory_gb", &form.memory_gb)?,
            all_gpus_visible: form.all_gpus_visible,
            gpus,
        })
    }

    fn gpu(&self, machine: &str, form: &GpuForm) -> Result<Gpu, InventoryFileError> {
        let owner = format!("{machine} gpu {}", form.index.get_ref());
        let held_outside = match &form.held_outside_gb {
            Some(held) => self.gb(&owner, "held_outside_gb", held)?,
            None => Bytes::ZERO,
        };
        Ok(Gpu {
            index: *form.index.get_ref(),
            uuid: form.uuid.clone(),
            model: form.model.clone(),
            vendor: form.vendor.to_lowercase(),
            total: self.gb(&owner, "memory_gb", &form.memory_gb)?,
            held_outside,
            healthy: form.healthy,
            mig: None,
        })
    }

    /// A GB figure in bytes, or an error naming its line, its owner and its field.
    fn gb(
        &self,
        owner: &str,
        field: &str,
        value: &Spanned<f64>,
    ) -> Result<Bytes, InventoryFileError> {
        Bytes::from_gb(*value.get_ref()).map_err(|e| {
            let line = self.line_and_column(value.span().start).0;
            self.invalid(Some(line), None, format!("{owner}: {field} {e}"))
        })
    }

    fn invalid(
        &self,
        line: Option<usize>,
        column: Option<usize>,
        message: String,
    ) -> InventoryFileError {
        InventoryFileError::Invalid {
            file: self.file.to_owned(),
            line,
            column,
            message,
        }
    }

    /// The 1-based line and column (in characters) of a byte offset into the text.
    fn line_and_column(&self, offset: usize) -> (usize, usize) {
        // The toml crate's spans fall on character boundaries; stepping back keeps a stray one safe.
        let end = (0..=offset.min(self.text.len()))
            .rev()
            .find(|&i| self.text.is_char_boundary(i))
            .unwrap_or(0);
        let before = &self.text[..end];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        (
            before.matches('\n').count() + 1,
            before[line_start..].chars().count() + 1,
        )
    }
}

/// Where in the file the problem that placement found is: the second of two machines with one name, the
/// second of two GPUs with one index, the figure held outside that is too large, the empty name.
fn offending_span(machines: &[MachineForm], error: &InventoryError) -> Option<Range<usize>> {
    fn with_name<'a>(
        machines: &'a [MachineForm],
        name: &'a str,
    ) -> impl Iterator<Item = &'a MachineForm> {
        machines.iter().filter(move |m| m.name.get_ref() == name)
    }
    let named = |name| with_name(machines, name);
    match error {
        InventoryError::DuplicateMachine(name) => named(name).nth(1).map(|m| m.name.span()),
        InventoryError::UnnamedMachine => named("").next().map(|m| m.name.span()),
        InventoryError::DuplicateGpu(gpu) => named(&gpu.machine)
            .next()?
            .gpu
            .iter()
            .filter(|g| *g.index.get_ref() == gpu.index)
            .nth(1)
            .map(|g| g.index.span()),
        InventoryError::MisnumberedGpu(gpu) => named(&gpu.machine)
            .next()?
            .gpu
            .iter()
            .find(|g| *g.index.get_ref() == gpu.index)
            .map(|g| g.index.span()),
        InventoryError::HeldOutsideOverTotal { gpu, .. } => {
            let form = named(&gpu.machine)
                .next()?
                .gpu
                .iter()
                .find(|g| *g.index.get_ref() == gpu.index)?;
            Some(form.held_outside_gb.as_ref()?.span())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAJIN: &str = r#"[[machine]]
name = "majin"
cpu_cores = 16
memory_gb = 64
all_gpus_visible = false   # true for a Windows PC under WSL2
[[machine.gpu]]
index = 0
model = "NVIDIA GeForce RTX 4060"
vendor = "nvidia"
memory_gb = 8
held_outside_gb = 1
healthy = true
"#;

    /// The example with line `line` (1-based) replaced.
    fn with_line(line: usize, replacement: &str) -> String {
        let mut lines: Vec<&str> = MAJIN.lines().collect();
        lines[line - 1] = replacement;
        lines.join("\n")
    }

    fn message(text: &str) -> String {
        parse_inventory(text).unwrap_err().to_string()
    }

    #[test]
    fn the_example_file_reads_as_majin_with_its_rtx_4060() {
        let machines = parse_inventory(MAJIN).unwrap();
        assert_eq!(
            machines,
            [Machine {
                name: "majin".into(),
                cpu_cores: 16,
                memory: Bytes::gb(64),
                all_gpus_visible: false,
                gpus: vec![Gpu {
                    index: 0,
                    uuid: String::new(),
                    model: "NVIDIA GeForce RTX 4060".into(),
                    vendor: "nvidia".into(),
                    total: Bytes::gb(8),
                    held_outside: Bytes::gb(1),
                    healthy: true,
                    mig: None,
                }],
            }]
        );
        assert_eq!(machines[0].gpus[0].offered(), Bytes::gb(7));
    }

    #[test]
    fn optional_keys_take_their_defaults_and_the_vendor_is_lower_cased() {
        let text = r#"
[[machine]]
name = "studio"
cpu_cores = 24
memory_gb = 31.5
[[machine.gpu]]
index = 1
uuid = "GPU-0a1b"
model = "NVIDIA GeForce RTX 3060"
vendor = "NVIDIA"
memory_gb = 12
"#;
        let machine = &parse_inventory(text).unwrap()[0];
        assert!(!machine.all_gpus_visible);
        assert_eq!(machine.memory, Bytes::from_gb(31.5).unwrap());
        let gpu = &machine.gpus[0];
        assert_eq!(gpu.uuid, "GPU-0a1b");
        assert_eq!(gpu.vendor, "nvidia");
        assert_eq!(gpu.held_outside, Bytes::ZERO);
        assert!(gpu.healthy);
    }

    #[test]
    fn an_empty_file_has_no_machines() {
        assert_eq!(parse_inventory("").unwrap(), []);
    }

    #[test]
    fn a_toml_syntax_error_names_its_line_and_column() {
        let text = with_line(8, r#"model = "NVIDIA GeForce RTX 4060"#);
        let message = message(&text);
        assert!(
            message.starts_with("inventory.toml line 8, column "),
            "{message}"
        );
    }

    #[test]
    fn an_unknown_key_names_its_line() {
        let text = with_line(9, r#"colour = "green""#);
        let message = message(&text);
        assert!(
            message.starts_with("inventory.toml line 9, column 1: unknown field `colour`"),
            "{message}"
        );
    }

    #[test]
    fn a_figure_of_the_wrong_type_names_its_line() {
        let text = with_line(3, "cpu_cores = -4");
        let message = message(&text);
        assert!(
            message.starts_with("inventory.toml line 3, column "),
            "{message}"
        );
    }

    #[test]
    fn a_negative_memory_figure_names_its_line() {
        let text = with_line(10, "memory_gb = -8");
        assert_eq!(
            message(&text),
            r#"inventory.toml line 10: machine "majin" gpu 0: memory_gb is negative"#
        );
        let text = with_line(4, "memory_gb = -64");
        assert_eq!(
            message(&text),
            r#"inventory.toml line 4: machine "majin": memory_gb is negative"#
        );
    }

    #[test]
    fn a_memory_figure_that_is_not_a_number_names_its_line() {
        let text = with_line(11, "held_outside_gb = nan");
        assert_eq!(
            message(&text),
            r#"inventory.toml line 11: machine "majin" gpu 0: held_outside_gb is not a number"#
        );
    }

    #[test]
    fn more_held_outside_than_the_gpu_has_names_its_line() {
        let text = with_line(11, "held_outside_gb = 9");
        assert_eq!(
            message(&text),
            "inventory.toml line 11: GPU 0 of majin holds 9 GB outside Tessera but has only 8 GB; \
             lower held_outside_gb"
        );
    }

    #[test]
    fn a_duplicate_machine_name_names_the_line_of_the_second() {
        let text = format!("{MAJIN}\n{MAJIN}");
        assert_eq!(
            message(&text),
            "inventory.toml line 15: two machines are named majin; give each machine its own name"
        );
    }

    #[test]
    fn a_duplicate_gpu_index_names_the_line_of_the_second() {
        let second_gpu = MAJIN.lines().skip(5).collect::<Vec<_>>().join("\n");
        let text = format!("{MAJIN}{second_gpu}\n");
        assert_eq!(
            message(&text),
            "inventory.toml line 14: GPU 0 of majin is listed twice; give each GPU of a machine its own index"
        );
    }

    #[test]
    fn a_gpu_numbered_where_mig_instances_are_names_its_line() {
        assert_eq!(
            message(&with_line(7, "index = 1000")),
            "inventory.toml line 7: GPU index 1000 of majin is where MIG instances are numbered (from 1000 up); number a GPU as NVML does, from 0"
        );
    }

    #[test]
    fn an_empty_machine_name_names_its_line() {
        let text = with_line(2, r#"name = """#);
        assert_eq!(
            message(&text),
            "inventory.toml line 2: a machine has no name; give it one"
        );
    }

    #[test]
    fn a_missing_required_field_names_its_line() {
        let text = with_line(8, "");
        let message = message(&text);
        assert!(
            message.starts_with("inventory.toml line 6, column "),
            "{message}"
        );
        assert!(message.contains("missing field `model`"), "{message}");
    }

    #[test]
    fn a_file_that_cannot_be_read_says_which_and_how_to_fix_it() {
        let err = load_inventory(Path::new("/nonexistent/inventory.toml")).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("could not read the inventory file /nonexistent/inventory.toml: "),
            "{message}"
        );
        assert!(
            message.ends_with("check the path given to --inventory"),
            "{message}"
        );
    }

    #[test]
    fn a_loaded_file_names_itself_in_its_errors() {
        let dir = std::env::temp_dir().join(format!("tessera-inventory-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fleet.toml");
        std::fs::write(&path, with_line(10, "memory_gb = -8")).unwrap();
        let message = load_inventory(&path).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            message,
            format!(
                r#"{} line 10: machine "majin" gpu 0: memory_gb is negative"#,
                path.display()
            )
        );
    }
}
