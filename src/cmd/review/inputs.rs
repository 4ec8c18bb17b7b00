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
            // A file as named, whatever its extension; one that is missing is said so when read.
            self.entries.push_back(Entry::File(path.to_owned()));
        } else {
            self.directory(path);
        }
    }

    /// A directory's manifests in name order (`kubectl -f DIR`'s rule: its own files only unless
    /// `recursive`); a Helm chart's files are named, not read (a chart is rendered first).
    fn directory(&mut self, path: &Path) {
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
            let name = entry.file_name().unwrap_or_default();
            if entry.is_dir() {
                if !self.recursive {
                    continue;
                }
                if chart && name != "crds" {
                    self.chart_files(&entry);
                } else {
                    self.directory(&entry);
                }
                continue;
            }
            if !is_manifest(&entry) {
                continue;
            }
            let shown = entry.display().to_string();
            if chart {
                self.unread(shown, CHART_FILE);
            } else if !entry.exists() {
                let target = std::fs::read_link(&entry).unwrap_or_default();
                let reason = format!("a dangling symlink (to {})", target.display());
                self.unread(shown, reason);
            } else {
                self.entries.push_back(Entry::File(entry));
            }
        }
    }

    /// Every manifest under a Helm chart's directory (its templates …), named as the chart's.
    fn chart_files(&mut self, path: &Path) {
        let Ok(real) = std::fs::canonicalize(path) else {
            return;
        };
        if !self.directories.insert(real) {
            return;
        }
        let Ok(dir) = std::fs::read_dir(path) else {
            return;
        };
        let mut entries: Vec<PathBuf> = dir.filter_map(|e| Some(e.ok()?.path())).collect();
        entries.sort();
        for entry in entries {
            if entry.is_dir() {
                self.chart_files(&entry);
            } else if is_manifest(&entry) || entry.extension().is_some_and(|e| e == "tpl") {
                self.unread(entry.display().to_string(), CHART_FILE);
            }
        }
    }

    fn unread(&mut self, file: String, reason: impl Into<String>) {
        self.entries.push_back(Entry::Unread(unread(file, reason)));
    }
}

const CHART_FILE: &str =
    "part of a Helm chart (a directory with Chart.yaml): review its rendering (`helm template`) instead";

fn is_manifest(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
}
