#include "ctl/table.h"

#include <algorithm>
#include <cassert>
#include <utility>

namespace kvcache::ctl {
namespace {

constexpr char kGap[] = "   ";

// One line of `cells` padded to `widths`; the last column is not padded on the right, so no line
// ends in spaces.
std::string Line(const std::vector<Column>& columns, const std::vector<size_t>& widths,
                 const std::vector<std::string>& cells) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (i > 0) line += kGap;
    const size_t pad = widths[i] > cells[i].size() ? widths[i] - cells[i].size() : 0;
    const bool last = i + 1 == cells.size();
    if (columns[i].align == Align::kRight) {
      line.append(pad, ' ');
      line += cells[i];
    } else {
      line += cells[i];
      if (!last) line.append(pad, ' ');
    }
  }
  line += '\n';
  return line;
}

std::vector<std::string> Headers(const std::vector<Column>& columns) {
  std::vector<std::string> headers;
  headers.reserve(columns.size());
  for (const Column& column : columns) headers.push_back(column.header);
  return headers;
}

}  // namespace

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

void Table::AddRow(std::vector<std::string> cells) {
  assert(cells.size() == columns_.size());
  cells.resize(columns_.size());  // a release build pads or cuts a malformed row, never overruns
  rows_.push_back(std::move(cells));
}

std::string Table::Render(bool headers) const {
  std::vector<size_t> widths;
  widths.reserve(columns_.size());
  for (const Column& column : columns_) widths.push_back(column.header.size());
  for (const std::vector<std::string>& row : rows_) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string text = headers ? Line(columns_, widths, Headers(columns_)) : "";
  for (const std::vector<std::string>& row : rows_) text += Line(columns_, widths, row);
  return text;
}

StreamTable::StreamTable(std::vector<Column> columns) : columns_(std::move(columns)) {
  widths_.reserve(columns_.size());
  for (const Column& column : columns_) {
    widths_.push_back(std::max(column.min_width, column.header.size()));
  }
}

std::string StreamTable::Header() const { return Line(columns_, widths_, Headers(columns_)); }

std::string StreamTable::Row(std::vector<std::string> cells) {
  assert(cells.size() == columns_.size());
  cells.resize(columns_.size());
  for (size_t i = 0; i < cells.size(); ++i) widths_[i] = std::max(widths_[i], cells[i].size());
  return Line(columns_, widths_, cells);
}

}  // namespace kvcache::ctl
