#include "tools/token_list.h"

#include <gtest/gtest.h>

namespace kvp::tools {
namespace {

TEST(TokenList, ParsesCommaSeparatedIds) {
  auto r = parse_token_list("1, 2,3 ");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r, (std::vector<int32_t>{1, 2, 3}));
}

TEST(TokenList, RejectsMalformedItemsNamingThem) {
  for (const char* bad : {"", "1,,2", "1,", "a", "-1", "1.5", "99999999999"}) {
    auto r = parse_token_list(bad);
    EXPECT_FALSE(r.is_ok()) << bad;
    if (!r.is_ok()) {
      EXPECT_NE(r.status().message().find("item"), std::string::npos) << r.status().message();
    }
  }
}

}  // namespace
}  // namespace kvp::tools
