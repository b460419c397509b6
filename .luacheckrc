std = "luajit"
max_line_length = 120
files["spec"] = { std = "+busted" }
files["spec/support/counts.lua"] = { unused_args = false }
exclude_files = { "build/**" }
