// Table: the aligned text tables kvcachectl prints, in the style of `kubectl get`: an upper-case
// header row, then one row per item; each column as wide as its widest cell, columns three spaces
// apart, numbers right-aligned so their digits line up. No trailing spaces, so `awk` and `cut`
// see clean fields (cells never hold spaces: callers put "-" for an empty value).
//
// StreamTable: the same look for rows that arrive one at a time (`kvcachectl events`), where the
// widths cannot be known in advance: each column starts at a fixed minimum width and only grows.
//
// Thread safety: thread-compatible value types.
#ifndef KVCACHE_CTL_TABLE_H_
#define KVCACHE_CTL_TABLE_H_

#include <cstddef>
#include <string>
#include <vector>

namespace kvcache::ctl {

enum class Align { kLeft, kRight };

struct Column {
  std::string header;
  Align align = Align::kLeft;
  // StreamTable only: the width the column starts at (at least the header's).
  size_t min_width = 0;
};

class Table {
 public:
  explicit Table(std::vector<Column> columns);

  // REQUIRES: cells.size() == the number of columns.
  void AddRow(std::vector<std::string> cells);
  size_t num_rows() const { return rows_.size(); }

  // The header row (unless `headers` is false: --no-headers) and every row, each ending in '\n'.
  std::string Render(bool headers = true) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

class StreamTable {
 public:
  explicit StreamTable(std::vector<Column> columns);

  // The header row, '\n'-terminated.
  std::string Header() const;
  // One row, '\n'-terminated; a cell wider than its column widens the column for later rows.
  // REQUIRES: cells.size() == the number of columns.
  std::string Row(std::vector<std::string> cells);

 private:
  std::vector<Column> columns_;
  std::vector<size_t> widths_;
};

}  // namespace kvcache::ctl

#endif  // KVCACHE_CTL_TABLE_H_
