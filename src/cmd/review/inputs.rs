//! `review`'s inputs, read one document at a time: the files named, the manifests of the
//! directories named (and of theirs with `-R`), `-` for standard input. A file or document that
//! cannot be read is an [`Unread`] with where and why, and the reading goes on.

use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::workload::{Document, Documents, Place, Unread};

/// One input: a document and its value, or what could not be read.
pub(super) enum Input {
    Object(Value, Document),
    Unread(Unread),
}

/// A file to read, or a path already known to be unreadable.
enum Entry {
    File(PathBuf),
    Unread(Unread),
}

/// The inputs, in the order named (a directory's in name order), read lazily: memory holds one
/// document (and the list of file names).
pub(super) struct Inputs {
    entries: VecDeque<Entry>,
    current: Option<Documents<Box<dyn BufRead>>>,
}

impl Inputs {
    pub(super) fn new(names: &[String], recursive: bool) -> Self {
        let mut walk = Walk {
            recursive,
            directories: HashSet::new(),
            entries: VecDeque::new(),
        };
        for name in names {
            walk.named(name);
        }
        Self {
            entries: walk.entries,
            current: None,
        }
    }

    /// Opens the next file; `None` when none is left.
    fn open_next(&mut self) -> Option<Result<(), Unread>> {
        let (reader, file): (Box<dyn BufRead>, String) = match self.entries.pop_front()? {
            Entry::Unread(unread) => return Some(Err(unread)),
            Entry::File(path) if path.as_os_str() == "-" => {
                (Box::new(BufReader::new(std::io::stdin())), "-".into())
            }
            Entry::File(path) => {
                let shown = path.display().to_string();
                match File::open(&path) {
                    Ok(file) => (Box::new(BufReader::new(file)), shown),
                    Err(e) => return Some(Err(unread(shown, format!("cannot read: {e}")))),
                }
            }
        };
        let reader = match crate::workload::encoding::decoded(reader) {
            Ok(reader) => reader,
            Err(e) => return Some(Err(unread(file, format!("cannot read: {e}")))),
        };
        self.current = Some(Documents::new(reader, file));
        Some(Ok(()))
    }
}

impl Iterator for Inputs {
    type Item = Input;

    fn next(&mut self) -> Option<Input> {
        loop {
            if let Some(documents) = &mut self.current {
                match documents.next() {
                    Some(Ok(document)) => {
                        return Some(match document.parse() {
                            Ok(value) => Input::Object(value, document),
                            Err(reason) => Input::Unread(Unread {
                                place: document.place,
                                reason,
                            }),
                        })
                    }
                    Some(Err(unread)) => return Some(Input::Unread(unread)),
                    None => self.current = None,
                }
            }
            if let Err(unread) = self.open_next()? {
                return Some(Input::Unread(unread));
            }
        }
    }
}

/// Each path named on the command line is there and can be read: a mistyped one is an error
/// (exit status 2), never a skipped input that lets a gate pass. A pipe or device named
/// (`<(kubectl kustomize …)`) is read as named; only a directory's are passed over.
pub(super) fn check_named(names: &[String]) -> anyhow::Result<()> {
    for name in names.iter().filter(|n| *n != "-") {
        let checked = std::fs::metadata(name).and_then(|meta| {
            if meta.is_dir() {
                std::fs::read_dir(name).map(drop)
            } else if meta.is_file() {
                File::open(name).map(drop)
            } else {
                Ok(())
            }
        });
        if let Err(e) = checked {
            anyhow::bail!("{name}: cannot read: {e}");
        }
    }
    Ok(())
}

fn unread(file: String, reason: impl Into<String>) -> Unread {
    Unread {
        place: Place::file(file),
        reason: reason.into(),
    }
}

/// The files to read, found before any is read.
struct Walk {
    recursive: bool,
    /// Directories read (by their real path): one reached again through a symlink is not read
    /// again, so a symlink loop ends.
    directories: HashSet<PathBuf>,
    entries: VecDeque<Entry>,
}

impl Walk {
    fn named(&mut self, name: &str) {
        let path = Path::new(name);
        if name == "-" || !path.is_dir() {
            // A file as named, whatever its extension and whatever it is (a pipe too:
            // `<(kubectl kustomize …)`).
            self.entries.push_back(Entry::File(path.to_owned()));
        } else {
            let templates = in_chart_templates(path);
            self.directory(path, templates);
        }
    }

    /// A directory's manifests in name order (`kubectl -f DIR`'s rule: its own files only unless
    /// `recursive`); a Helm chart's templates (`templates/` beside `Chart.yaml`, at any depth)
    /// are named, not read (a chart is rendered first), its other files are read.
    fn directory(&mut self, path: &Path, templates: bool) {
        let shown = path.display().to_string();
        let real = match std::fs::canonicalize(path) {
            Ok(real) => real,
            Err(e) => return self.unread(shown, format!("cannot read: {e}")),
        };
        if !self.directories.insert(real) {
            return;
        }
        let entries = std::fs::read_dir(path).and_then(|dir| {
            dir.map(|entry| entry.map(|e| e.path()))
                .collect::<Result<Vec<_>, _>>()
        });
        let mut entries = match entries {
            Ok(entries) => entries,
            Err(e) => return self.unread(shown, format!("cannot read: {e}")),
        };
        entries.sort();
        let chart = path.join("Chart.yaml").is_file();
        for entry in entries {
            if entry.is_dir() {
                if self.recursive {
                    let name = entry.file_name().unwrap_or_default();
                    self.directory(&entry, templates || (chart && name == "templates"));
                }
                continue;
            }
            let template = templates && entry.extension().is_some_and(|e| e == "tpl");
            if !is_manifest(&entry) && !template {
                continue;
            }
            let shown = entry.display().to_string();
            match std::fs::metadata(&entry) {
                _ if templates => self.unread(shown, CHART_FILE),
                Ok(meta) if meta.is_file() => self.entries.push_back(Entry::File(entry)),
                // Never opened: opening a FIFO would wait for a writer that may never come.
                Ok(meta) => self.unread(shown, format!("{}: not read", not_regular(&meta))),
                Err(_) => {
                    let target = std::fs::read_link(&entry).unwrap_or_default();
                    let reason = format!("a dangling symlink (to {})", target.display());
                    self.unread(shown, reason);
                }
            }
        }
    }

    fn unread(&mut self, file: String, reason: impl Into<String>) {
        self.entries.push_back(Entry::Unread(unread(file, reason)));
    }
}

/// Whether `path` is in a Helm chart's `templates/` (the directory beside a `Chart.yaml`, or
/// below it), so that a chart's templates are skipped whichever directory is named.
fn in_chart_templates(path: &Path) -> bool {
    let Ok(real) = std::fs::canonicalize(path) else {
        return false;
    };
    real.ancestors().any(|dir| {
        dir.file_name().is_some_and(|n| n == "templates")
            && dir.parent().is_some_and(|p| p.join("Chart.yaml").is_file())
    })
}

/// What a file that is not a regular file is.
fn not_regular(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        let kind = meta.file_type();
        if kind.is_fifo() {
            return "a FIFO, not a regular file";
        }
        if kind.is_socket() {
            return "a socket, not a regular file";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device, not a regular file";
        }
    }
    let _ = meta;
    "not a regular file"
}

const CHART_FILE: &str =
    "a Helm chart's template (templates/ beside Chart.yaml): review its rendering (`helm template`) instead";

fn is_manifest(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
}
