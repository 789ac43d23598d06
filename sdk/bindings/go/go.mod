module cmf

go 1.19
