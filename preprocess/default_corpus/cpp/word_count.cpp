#include <algorithm>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

int main() {
  std::map<std::string, int> counts;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      std::transform(w.begin(), w.end(), w.begin(), ::tolower);
      ++counts[w];
    }
  }
  std::vector<std::pair<std::string, int>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  for (const auto& [word, n] : sorted) {
    std::cout << n << '\t' << word << '\n';
  }
  return 0;
}
